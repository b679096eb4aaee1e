package apachekafka

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Options configures [Start].
type Options struct {
	// Nodes is the number of brokers, each also a controller (KRaft
	// combined mode) and a voter of the one controller quorum. Defaults
	// to 1.
	Nodes int
	// Dir holds one directory per node (configuration, data, logs). When
	// empty, Start makes a temporary directory and Stop removes it.
	Dir string
	// CacheDir holds the resolved jars. Defaults to [CacheDir].
	CacheDir string
	// Progress receives the progress of a first resolution and one line
	// per node started. Defaults to io.Discard.
	Progress io.Writer
	// BrokerAddr is the client listener (host:port) of the first node.
	// When empty or its port is 0, a free port of 127.0.0.1 is picked, as
	// for every other listener.
	BrokerAddr string
	// AutoCreateTopics sets the brokers' auto.create.topics.enable (a topic
	// is still created only for clients that ask for it). Defaults to
	// false.
	AutoCreateTopics bool
	// HeapMB is each JVM's maximum heap in MiB. Defaults to 384.
	HeapMB int
	// Props are extra broker settings, applied over the defaults of
	// [BrokerProps].
	Props map[string]string
}

// Cluster is a running Apache Kafka cluster: one JVM per node, started by
// [Start] and stopped by [Cluster.Stop].
type Cluster struct {
	opts      Options
	java      string
	lib       string
	dir       string
	ownDir    bool
	clusterID string
	nodes     []*Node
}

// Node is one broker-and-controller of a [Cluster].
type Node struct {
	// Index is the node's position in the cluster, from 0.
	Index int
	// ID is the node's node.id (Index+1).
	ID int32
	// Addr is the client (PLAINTEXT) listener, host:port on 127.0.0.1.
	Addr string
	// ControllerAddr is the controller quorum listener.
	ControllerAddr string
	// Dir holds server.properties, log4j2.properties, data/, server.log
	// (the broker's log) and stdout.log (the JVM's own output).
	Dir string

	c      *Cluster
	mu     sync.Mutex
	proc   *process // nil when not running
	paused bool
}

// process is one JVM; done closes once it has exited and been waited for.
type process struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// Start resolves the jars (see [Resolve]), formats every node's storage
// with one cluster id, starts one JVM per node and returns once every
// broker answers Metadata listing every node, or ctx ends. On error every
// JVM it started is killed.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	opts.Nodes = max(opts.Nodes, 1)
	if opts.HeapMB <= 0 {
		opts.HeapMB = 384
	}
	if opts.Progress == nil {
		opts.Progress = io.Discard
	}
	java, err := javaPath()
	if err != nil {
		return nil, err
	}
	if opts.CacheDir == "" {
		if opts.CacheDir, err = CacheDir(); err != nil {
			return nil, err
		}
	}
	lib, err := Resolve(ctx, opts.CacheDir, opts.Progress)
	if err != nil {
		return nil, err
	}
	c := &Cluster{opts: opts, java: java, lib: lib, dir: opts.Dir}
	if c.dir == "" {
		if c.dir, err = os.MkdirTemp("", "apachekafka-"); err != nil {
			return nil, fmt.Errorf("apachekafka: %w", err)
		}
		c.ownDir = true
	}
	if err := c.start(ctx); err != nil {
		_ = c.Stop()
		return nil, err
	}
	return c, nil
}

func (c *Cluster) start(ctx context.Context) error {
	addrs, err := freeAddrs(2*c.opts.Nodes, c.opts.BrokerAddr)
	if err != nil {
		return err
	}
	c.clusterID = newClusterID()
	var voters []string
	for i := range c.opts.Nodes {
		n := &Node{
			Index: i, ID: int32(i + 1), c: c,
			Addr: addrs[2*i], ControllerAddr: addrs[2*i+1],
			Dir: filepath.Join(c.dir, "node"+strconv.Itoa(i+1)),
		}
		c.nodes = append(c.nodes, n)
		voters = append(voters, fmt.Sprintf("%d@%s", n.ID, n.ControllerAddr))
	}
	for _, n := range c.nodes {
		if err := n.writeConfig(strings.Join(voters, ",")); err != nil {
			return err
		}
	}
	// Formatting is a JVM start of its own per node (seconds): in parallel.
	errs := make([]error, len(c.nodes))
	var wg sync.WaitGroup
	for i, n := range c.nodes {
		wg.Go(func() { errs[i] = n.format(ctx) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	for _, n := range c.nodes {
		if err := n.launch(); err != nil {
			return err
		}
	}
	if err := c.WaitReady(ctx); err != nil {
		return err
	}
	for _, n := range c.nodes {
		fmt.Fprintf(c.opts.Progress, "apachekafka: node %d serving %s (controller %s, logs %s)\n", n.ID, n.Addr, n.ControllerAddr, filepath.Join(n.Dir, "server.log"))
	}
	return nil
}

// freeAddrs returns n distinct free addresses on 127.0.0.1, the first
// being first when it names a port. The listeners are held until all are
// picked so that no port is returned twice.
//
// The ports come from below the kernel's ephemeral range when it can tell
// (listenPort): a node binds its ports seconds after they were picked (its
// storage is formatted first), and binds them again when it restarts after
// a kill, while every outgoing connection of the machine takes a port of
// the ephemeral range. A port from that range would be taken meanwhile
// now and then ("Address already in use"), most often on a busy machine.
func freeAddrs(n int, first string) ([]string, error) {
	var out []string
	var held []net.Listener
	defer func() {
		for _, l := range held {
			l.Close()
		}
	}()
	if first != "" {
		host, port, err := net.SplitHostPort(first)
		if err != nil {
			return nil, fmt.Errorf("apachekafka: broker address %q: %w", first, err)
		}
		if port != "0" {
			out = append(out, net.JoinHostPort(host, port))
		}
	}
	low := ephemeralLow()
	for len(out) < n {
		l, err := listenPort(low)
		if err != nil {
			return nil, fmt.Errorf("apachekafka: free port: %w", err)
		}
		held = append(held, l)
		out = append(out, l.Addr().String())
	}
	return out, nil
}

// minPort is the lowest port freeAddrs picks below the ephemeral range.
const minPort = 10000

// listenPort listens on a free loopback port below low, the first port of
// the ephemeral range, tried at random; any free port when low leaves no
// room or none is free after a few tries.
func listenPort(low int) (net.Listener, error) {
	if low-minPort >= 1000 {
		for range 50 {
			var b [2]byte
			_, _ = rand.Read(b[:])
			port := minPort + (int(b[0])<<8|int(b[1]))%(low-minPort)
			if l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port))); err == nil {
				return l, nil
			}
		}
	}
	return net.Listen("tcp", "127.0.0.1:0")
}

// ephemeralLow is the first port of the kernel's ephemeral range (Linux),
// or 0 when it cannot be read.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	low, err := strconv.Atoi(f[0])
	if err != nil {
		return 0
	}
	return low
}

// newClusterID returns a random cluster id in Kafka's form: 16 random
// bytes in unpadded URL-safe base64, not starting with '-' (Kafka's
// Uuid.randomUuid rejects those, as command-line arguments).
func newClusterID() string {
	for {
		var b [16]byte
		_, _ = rand.Read(b[:])
		id := base64.RawURLEncoding.EncodeToString(b[:])
		if !strings.HasPrefix(id, "-") {
			return id
		}
	}
}

// Nodes returns the cluster's nodes, in Index order.
func (c *Cluster) Nodes() []*Node { return c.nodes }

// Node returns the node of index i, nil when there is none.
func (c *Cluster) Node(i int) *Node {
	if i < 0 || i >= len(c.nodes) {
		return nil
	}
	return c.nodes[i]
}

// Brokers returns every node's client address, in Index order.
func (c *Cluster) Brokers() []string {
	out := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		out[i] = n.Addr
	}
	return out
}

// ClusterID returns the id every node was formatted with.
func (c *Cluster) ClusterID() string { return c.clusterID }

// Stop kills every JVM (SIGKILL to its process group), waits until each
// has exited, and removes the cluster's directory when Start made it.
// Calling it again does nothing more.
func (c *Cluster) Stop() error {
	var wg sync.WaitGroup
	errs := make([]error, len(c.nodes))
	for i, n := range c.nodes {
		wg.Go(func() { errs[i] = n.Kill() })
	}
	wg.Wait()
	if c.ownDir {
		if err := os.RemoveAll(c.dir); err != nil {
			errs = append(errs, err)
		}
		c.ownDir = false
	}
	return errors.Join(errs...)
}

// writeConfig writes the node's server.properties and log4j2.properties.
func (n *Node) writeConfig(voters string) error {
	if err := os.MkdirAll(n.Dir, 0o755); err != nil {
		return fmt.Errorf("apachekafka: %w", err)
	}
	props := BrokerProps(len(n.c.nodes), n.c.opts.AutoCreateTopics)
	props["node.id"] = strconv.Itoa(int(n.ID))
	props["controller.quorum.voters"] = voters
	props["listeners"] = "PLAINTEXT://" + n.Addr + ",CONTROLLER://" + n.ControllerAddr
	props["advertised.listeners"] = "PLAINTEXT://" + n.Addr
	props["log.dirs"] = filepath.Join(n.Dir, "data")
	for k, v := range n.c.opts.Props {
		props[k] = v
	}
	if err := os.WriteFile(n.propsPath(), []byte(formatProps(props)), 0o644); err != nil {
		return fmt.Errorf("apachekafka: %w", err)
	}
	if err := os.WriteFile(n.log4jPath(), []byte(log4jConfig(n.LogPath())), 0o644); err != nil {
		return fmt.Errorf("apachekafka: %w", err)
	}
	return nil
}

func (n *Node) propsPath() string { return filepath.Join(n.Dir, "server.properties") }
func (n *Node) log4jPath() string { return filepath.Join(n.Dir, "log4j2.properties") }

// LogPath returns the path of the broker's log file.
func (n *Node) LogPath() string { return filepath.Join(n.Dir, "server.log") }

// javaArgs returns the JVM's arguments before the main class: a small heap
// and flags that shorten the start (C1 only, serial GC).
func (n *Node) javaArgs() []string {
	return []string{
		"-Xmx" + strconv.Itoa(n.c.opts.HeapMB) + "m",
		"-XX:+UseSerialGC",
		"-XX:TieredStopAtLevel=1",
		"-XX:-UsePerfData",
		"-Djava.awt.headless=true",
		"-Dlog4j2.configurationFile=" + n.log4jPath(),
		"-cp", filepath.Join(n.c.lib, "*"),
	}
}

// format runs kafka.tools.StorageTool format on the node's log dir.
func (n *Node) format(ctx context.Context) error {
	args := append(n.javaArgs(), "kafka.tools.StorageTool", "format",
		"-t", n.c.clusterID, "-c", n.propsPath(), "--ignore-formatted")
	cmd := exec.CommandContext(ctx, n.c.java, args...)
	cmd.SysProcAttr = sysProcAttr()
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("apachekafka: format node %d: %w\n%s", n.ID, err, out)
	}
	return nil
}

// launch starts the node's JVM and a goroutine that waits for its exit.
func (n *Node) launch() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.proc != nil {
		return nil
	}
	out, err := os.OpenFile(filepath.Join(n.Dir, "stdout.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("apachekafka: %w", err)
	}
	args := append(n.javaArgs(), "kafka.Kafka", n.propsPath())
	cmd := exec.Command(n.c.java, args...)
	cmd.Dir = n.Dir
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		out.Close()
		return fmt.Errorf("apachekafka: start node %d: %w", n.ID, err)
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		out.Close()
		close(p.done)
	}()
	n.proc, n.paused = p, false
	return nil
}

// running returns the node's process, nil when it is not running.
func (n *Node) running() *process {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.proc
}

// Running reports whether the node's JVM was started and not killed.
func (n *Node) Running() bool { return n.running() != nil }

// Paused reports whether the node's JVM is stopped by [Node.Pause].
func (n *Node) Paused() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.proc != nil && n.paused
}

// Pid returns the JVM's process id, 0 when it is not running.
func (n *Node) Pid() int {
	if p := n.running(); p != nil {
		return p.cmd.Process.Pid
	}
	return 0
}

// Kill sends SIGKILL to the node's JVM, as a crash would, and waits until
// it has exited. Killing a node that is not running does nothing.
func (n *Node) Kill() error {
	n.mu.Lock()
	p := n.proc
	n.mu.Unlock()
	if p == nil {
		return nil
	}
	if err := signalGroup(p.cmd.Process.Pid, sigKill); err != nil {
		return fmt.Errorf("apachekafka: kill node %d: %w", n.ID, err)
	}
	<-p.done
	n.mu.Lock()
	if n.proc == p {
		n.proc, n.paused = nil, false
	}
	n.mu.Unlock()
	return nil
}

// Pause stops the node's JVM with SIGSTOP: its connections stay open and
// nothing answers, as for a long GC pause or a frozen machine.
func (n *Node) Pause() error { return n.signal(sigStop, "pause", true) }

// Resume continues a JVM stopped by [Node.Pause] with SIGCONT.
func (n *Node) Resume() error { return n.signal(sigCont, "resume", false) }

func (n *Node) signal(sig syscall.Signal, verb string, paused bool) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.proc == nil {
		return fmt.Errorf("apachekafka: %s node %d: not running", verb, n.ID)
	}
	if err := signalGroup(n.proc.cmd.Process.Pid, sig); err != nil {
		return fmt.Errorf("apachekafka: %s node %d: %w", verb, n.ID, err)
	}
	n.paused = paused
	return nil
}

// Restart kills the node's JVM when it runs, starts it again on the same
// ports and data, and returns once every running node lists it, or ctx
// ends.
func (n *Node) Restart(ctx context.Context) error {
	if err := n.Kill(); err != nil {
		return err
	}
	return n.Start(ctx)
}

// Start starts a node that was killed, on the same ports and data, and
// returns once every running node lists it, or ctx ends. Starting a
// running node only waits.
func (n *Node) Start(ctx context.Context) error {
	if err := n.launch(); err != nil {
		return err
	}
	return n.c.WaitReady(ctx)
}

// exited returns the JVM's exit error and a tail of its logs when it has
// exited, nil while it runs.
func (n *Node) exited() error {
	p := n.running()
	if p == nil {
		return nil
	}
	select {
	case <-p.done:
		return fmt.Errorf("apachekafka: node %d exited (%v); log tail:\n%s", n.ID, p.err, n.logTail())
	default:
		return nil
	}
}

// logTail returns the last lines of the node's stdout.log and server.log.
func (n *Node) logTail() string {
	var b strings.Builder
	for _, name := range []string{"stdout.log", "server.log"} {
		data, _ := os.ReadFile(filepath.Join(n.Dir, name))
		lines := strings.Split(strings.TrimSpace(string(data)), "\n")
		if len(lines) > 15 {
			lines = lines[len(lines)-15:]
		}
		fmt.Fprintf(&b, "--- %s\n%s\n", name, strings.Join(lines, "\n"))
	}
	return b.String()
}

// wait returns after d or when ctx ends, whichever is first.
func wait(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
