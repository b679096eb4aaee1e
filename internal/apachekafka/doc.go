// Package apachekafka runs real Apache Kafka brokers for tests and the dev
// stack: the pinned release [Version], from its jars on Maven Central, in
// KRaft combined mode (every node a broker and a controller), on loopback
// ports.
//
// # What it owns
//
//   - The jar cache: [Resolve] runs Maven once on the embedded pom.xml
//     (kafka_2.13 and a log4j2 backend) into [CacheDir] and writes a
//     marker only after a complete resolution; a later call finds the
//     marker and starts no Maven, so later starts are offline. A lock file
//     serialises concurrent resolutions across processes.
//   - The cluster's directory (one subdirectory per node: configuration,
//     data, server.log, stdout.log), a temporary one removed by
//     [Cluster.Stop] unless [Options.Dir] names one.
//   - One JVM per node, started by [Start] (after one short-lived JVM per
//     node that formats its storage) and by [Node.Restart].
//
// # Processes and goroutines
//
// Each JVM runs in a process group of its own, with Pdeathsig=SIGKILL on
// Linux, so that the kernel kills it when the Go process dies, however it
// dies. For each JVM one goroutine waits for its exit; it ends when the JVM
// does. [Node.Kill] sends SIGKILL to the group and waits for that
// goroutine; [Cluster.Stop] kills every node that way, so that when it
// returns no JVM of the cluster runs and none of its ports listens.
// [Node.Pause] and [Node.Resume] send SIGSTOP and SIGCONT.
//
// Readiness is asked of the brokers, never slept for: [Cluster.WaitReady]
// polls each running node with a Metadata request until every node lists
// every running node.
package apachekafka
