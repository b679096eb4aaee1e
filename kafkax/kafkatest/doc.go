// Package kafkatest starts a Kafka cluster for tests: the in-process kfake
// broker from franz-go by default, or real brokers when the environment
// variable OUTBOX_TEST_KAFKA_BROKERS is set.
//
// It serves this module's own tests and users testing their own handlers.
//
// # Backends
//
// Without OUTBOX_TEST_KAFKA_BROKERS every call to [Start] starts its own kfake
// cluster on 127.0.0.1 (random ports) and closes it in t.Cleanup. Clusters are
// cheap (a few milliseconds), and a cluster per test keeps fault injection
// ([Env.Cluster] with kfake's ControlKey) from leaking into parallel tests.
//
// With OUTBOX_TEST_KAFKA_BROKERS=host1:9092,host2:9092 every test talks to
// those brokers. Tests are isolated by topic names: [Env.Topic] creates a
// uniquely named topic and deletes it in t.Cleanup. Topics given with
// [SeedTopics] are created if missing and left in place (their names are
// shared by every test using them), so prefer [Env.Topic] for tests that may
// run against a real cluster. [Env.Cluster] is nil against real brokers: test
// code that injects faults must skip there.
//
// A test that must run against real Kafka calls [StartReal] instead: it uses
// OUTBOX_TEST_KAFKA_BROKERS when set and skips the test otherwise (as
// mongotest.StartReal does for MongoDB). To start a Kafka container when no
// brokers are given, use package kafkacontainer (a module of its own, so that
// testcontainers-go is required only by the tests that import it).
//
// # Apache Kafka brokers of a test's own
//
// [StartApache] starts real Apache Kafka ([ApacheVersion], KRaft mode) for
// one test: one JVM per node ([NumBrokers]) on free ports of 127.0.0.1,
// killed in t.Cleanup. It needs Java 17+, and Maven for the first start on
// a machine, which fetches the jars into ~/.cache/outbox-kafka; without
// them it skips the test saying what to install (or fails it when
// OUTBOX_TEST_APACHE_REQUIRED is set). Its Env controls the nodes by index:
// [Env.Kill] (SIGKILL), [Env.Pause] (SIGSTOP), [Env.Resume], [Env.Restart],
// and names the leader of a partition ([Env.PartitionLeader]) and the
// active controller ([Env.Controller]).
//
// # Usage
//
//	func TestHandler(t *testing.T) {
//		kenv := kafkatest.Start(t)
//		topic := kenv.Topic(t, 3)
//		cl := kenv.Client(t, kgo.DefaultProduceTopic(topic))
//		// produce, consume, assert...
//	}
package kafkatest
