package mongofake

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/event-outbox/outbox/mongox/internal/engine"
	"github.com/event-outbox/outbox/mongox/internal/wire"
)

// Server is an in-process MongoDB-compatible server that presents itself to
// clients as the primary of a single-node replica set. Create one with
// NewServer and stop it with Close.
type Server struct {
	engine *engine.Engine
	data   *dataState // data command families' state; see state.go
	logger *slog.Logger

	cfg        config
	ln         net.Listener
	host       string // advertised host:port ("" when the listener is on an unspecified address)
	started    time.Time
	electionID bson.ObjectID

	ctx    context.Context // ends when Close starts
	cancel context.CancelFunc

	mu     sync.Mutex
	conns  map[int64]*conn
	closed bool

	wg        sync.WaitGroup // accept loop and connection goroutines
	closeOnce sync.Once

	nextConnID atomic.Int64
	nextOpID   atomic.Int64 // opid of the next command ($currentOp)
	nextReqID  atomic.Int32

	fp      failPoints
	crashes crashes // Server.Crash
}

// config holds the values set by Options.
type config struct {
	listenAddr          string
	replSet             string
	oplogSize           int
	ttlInterval         time.Duration
	transactionLifetime time.Duration
	historyWindow       time.Duration
	logger              *slog.Logger
	testCommands        bool
	maxMessageSize      int
}

// Option configures a Server.
type Option func(*config)

// ListenAddr sets the address the server listens on. Defaults to
// "127.0.0.1:0" (a free port on the loopback interface).
func ListenAddr(addr string) Option { return func(c *config) { c.listenAddr = addr } }

// ReplicaSetName sets the replica set name the server reports in hello
// (setName) and in URI. Defaults to "rs0".
func ReplicaSetName(name string) Option { return func(c *config) { c.replSet = name } }

// OplogSize bounds the number of oplog entries kept for change streams.
// Defaults to the engine's default (100000).
func OplogSize(n int) Option { return func(c *config) { c.oplogSize = n } }

// TTLInterval sets how often the TTL monitor deletes expired documents.
// Clients can change it with setParameter ttlMonitorSleepSecs. Defaults to
// 60 seconds, as in mongod.
func TTLInterval(d time.Duration) Option { return func(c *config) { c.ttlInterval = d } }

// TransactionLifetime sets how long a transaction may stay open before the
// server aborts it. Clients can change it for the transactions they start
// afterwards with setParameter transactionLifetimeLimitSeconds. Defaults to
// 60 seconds, as mongod's transactionLifetimeLimitSeconds.
func TransactionLifetime(d time.Duration) Option {
	return func(c *config) { c.transactionLifetime = d }
}

// SnapshotHistoryWindow sets how long committed document versions stay
// readable by a snapshot read at a past time (readConcern atClusterTime),
// as mongod's minSnapshotHistoryWindowInSeconds does; older reads fail with
// 239 SnapshotTooOld. A negative value keeps only what open snapshots need.
// Clients can change it with setParameter minSnapshotHistoryWindowInSeconds.
// Defaults to 10 seconds (mongod keeps 300, which would hold minutes of
// versions in the memory of write-heavy tests).
func SnapshotHistoryWindow(d time.Duration) Option { return func(c *config) { c.historyWindow = d } }

// Logger sets the logger for connection and server events. Defaults to a
// logger that discards everything.
func Logger(l *slog.Logger) Option { return func(c *config) { c.logger = l } }

// EnableTestCommands enables test-only commands, today configureFailPoint
// (the failCommand fail point of MongoDB's driver specification tests), as
// mongod's enableTestCommands parameter does. Defaults to false.
func EnableTestCommands(enable bool) Option { return func(c *config) { c.testCommands = enable } }

// MaxMessageSize sets the largest wire message the server accepts, in bytes;
// it is reported as maxMessageSizeBytes in hello. Defaults to 48000000, as
// in mongod.
func MaxMessageSize(n int) Option { return func(c *config) { c.maxMessageSize = n } }

// NewServer starts a server: it listens, creates the storage engine and
// accepts connections in the background until Close.
func NewServer(opts ...Option) (*Server, error) {
	cfg := config{
		listenAddr:     "127.0.0.1:0",
		replSet:        "rs0",
		maxMessageSize: wire.DefaultMaxMessageSize,
	}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.logger == nil {
		cfg.logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if cfg.replSet == "" {
		return nil, errors.New("mongofake: ReplicaSetName must not be empty")
	}
	if cfg.maxMessageSize <= 0 {
		cfg.maxMessageSize = wire.DefaultMaxMessageSize
	}

	ln, err := net.Listen("tcp", cfg.listenAddr)
	if err != nil {
		return nil, fmt.Errorf("mongofake: listen on %s: %w", cfg.listenAddr, err)
	}
	s := &Server{
		logger:     cfg.logger,
		cfg:        cfg,
		ln:         ln,
		started:    time.Now(),
		electionID: electionID,
		conns:      map[int64]*conn{},
	}
	if tcp, ok := ln.Addr().(*net.TCPAddr); ok && !tcp.IP.IsUnspecified() {
		s.host = tcp.String()
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.engine = engine.New(engine.Options{
		OplogSize:           cfg.oplogSize,
		TTLInterval:         cfg.ttlInterval,
		TransactionLifetime: cfg.transactionLifetime,
		HistoryWindow:       cfg.historyWindow,
		Logger:              cfg.logger,
	})
	s.data = newDataState(s)

	s.wg.Add(1)
	go s.acceptLoop()
	s.logger.Info("mongofake: listening", "addr", ln.Addr().String(), "replicaSet", cfg.replSet)
	return s, nil
}

// electionID is the fixed electionId this single, never-changing primary
// reports (the form mongod uses for term 1).
var electionID, _ = bson.ObjectIDFromHex("7fffffff0000000000000001")

// Addr returns the host:port the server listens on.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// URI returns a connection string that reaches the server as a replica set
// ("mongodb://HOST:PORT/?replicaSet=rs0"): sessions, transactions, change
// streams, retryable reads and writes all work with the driver's defaults.
func (s *Server) URI() string {
	return "mongodb://" + s.uriHost() + "/?replicaSet=" + s.cfg.replSet
}

// uriHost is the host:port URI and DirectURI use: the listener's address,
// or the loopback address with its port when the server listens on an
// unspecified address (hello then reports the address each client dialled).
func (s *Server) uriHost() string {
	if s.host != "" {
		return s.host
	}
	tcp, ok := s.ln.Addr().(*net.TCPAddr)
	if !ok {
		return s.Addr()
	}
	loopback := "127.0.0.1"
	if h, _, err := net.SplitHostPort(s.cfg.listenAddr); err == nil && strings.Contains(h, ":") {
		loopback = "::1" // an IPv6 literal such as "::" was asked for
	}
	return net.JoinHostPort(loopback, strconv.Itoa(tcp.Port))
}

// DirectURI returns a connection string that connects to the server directly
// ("mongodb://HOST:PORT/?directConnection=true"), without replica set
// discovery.
func (s *Server) DirectURI() string {
	return "mongodb://" + s.uriHost() + "/?directConnection=true"
}

// ConnectionCount returns the number of open client connections.
func (s *Server) ConnectionCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

// DropConnections closes every open client connection now, as a network
// failure or a server restart would. Clients reconnect on their next
// operation. Commands running on those connections finish but their replies
// are lost.
func (s *Server) DropConnections() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.conns {
		c.cancel() // ends a command blocked in an await or a fail point
		_ = c.nc.Close()
	}
}

// Close stops the server: it stops accepting, closes every connection, waits
// for the connection goroutines, then stops the data state and the engine.
// It is safe to call more than once; later calls return at once.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		s.cancel()
		_ = s.ln.Close()
		s.mu.Lock()
		s.closed = true
		for _, c := range s.conns {
			_ = c.nc.Close()
		}
		s.mu.Unlock()
		s.wg.Wait()
		s.data.close()
		s.engine.Close()
		s.logger.Info("mongofake: closed", "addr", s.ln.Addr().String())
	})
	return nil
}

// acceptLoop accepts connections until the listener closes.
func (s *Server) acceptLoop() {
	defer s.wg.Done()
	var delay time.Duration
	for {
		nc, err := s.ln.Accept()
		if err != nil {
			if s.ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			// Temporary failure (for example too many open files): back off.
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			s.logger.Warn("mongofake: accept failed", "err", err, "retryIn", delay)
			t := time.NewTimer(delay)
			select {
			case <-t.C:
			case <-s.ctx.Done():
				t.Stop()
				return
			}
			continue
		}
		delay = 0
		c := s.newConn(nc)
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			_ = nc.Close()
			c.cancel()
			return
		}
		s.conns[c.id] = c
		s.wg.Add(1)
		s.mu.Unlock()
		go c.serve()
	}
}

// removeConn forgets a closed connection.
func (s *Server) removeConn(c *conn) {
	s.mu.Lock()
	delete(s.conns, c.id)
	s.mu.Unlock()
}

// advertisedHost returns the host:port the server reports as hosts, primary
// and me: the listener's address, or, when it listens on an unspecified
// address (0.0.0.0, ::), the local address the client dialled.
func (s *Server) advertisedHost(c *conn) string {
	if s.host != "" || c == nil {
		return cmp.Or(s.host, s.Addr())
	}
	return c.nc.LocalAddr().String()
}
