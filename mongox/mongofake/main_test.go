package mongofake

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.uber.org/goleak"

	"github.com/event-outbox/outbox/mongox/internal/wire"
)

// TestMain fails the run when any goroutine (server, engine or driver)
// outlives the tests.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// newTestServer starts a server closed at the end of the test.
func newTestServer(t testing.TB, opts ...Option) *Server {
	t.Helper()
	srv, err := NewServer(opts...)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, srv.Close()) })
	return srv
}

// connect opens a driver client on uri, disconnected at the end of the test.
func connect(t testing.TB, uri string, opts ...*options.ClientOptions) *mongo.Client {
	t.Helper()
	all := append([]*options.ClientOptions{options.Client().ApplyURI(uri).SetServerSelectionTimeout(5 * time.Second)}, opts...)
	client, err := mongo.Connect(all...)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = client.Disconnect(ctx)
	})
	return client
}

// setup starts a server with test commands and connects a replica-set client.
func setup(t testing.TB, opts ...Option) (*Server, *mongo.Client) {
	t.Helper()
	srv := newTestServer(t, append([]Option{EnableTestCommands(true)}, opts...)...)
	return srv, connect(t, srv.URI())
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// runCmd runs a command and decodes its reply.
func runCmd(t testing.TB, db *mongo.Database, cmd bson.D) (bson.D, error) {
	t.Helper()
	var out bson.D
	err := db.RunCommand(testCtx(t), cmd).Decode(&out)
	return out, err
}

// rawDial opens a plain TCP connection to srv.
func rawDial(t testing.TB, srv *Server) net.Conn {
	t.Helper()
	nc, err := net.DialTimeout("tcp", srv.Addr(), 5*time.Second)
	require.NoError(t, err)
	t.Cleanup(func() { _ = nc.Close() })
	require.NoError(t, nc.SetDeadline(time.Now().Add(10*time.Second)))
	return nc
}

// rawMsg sends an OP_MSG command.
func rawMsg(t testing.TB, nc net.Conn, reqID int32, flags uint32, cmd bson.D) {
	t.Helper()
	raw, err := bson.Marshal(cmd)
	require.NoError(t, err)
	require.NoError(t, wire.WriteMsg(nc, reqID, 0, flags, raw))
}

// readMsgReply reads one OP_MSG reply.
func readMsgReply(t testing.TB, nc net.Conn) (*wire.Message, bson.D) {
	t.Helper()
	m, err := wire.ReadMessage(nc, 0)
	require.NoError(t, err)
	require.NotNil(t, m.Msg)
	body, err := m.Msg.Body()
	require.NoError(t, err)
	return m, body
}

// rawQuery sends a legacy OP_QUERY to ns.
func rawQuery(t testing.TB, nc net.Conn, reqID int32, ns string, cmd bson.D) {
	t.Helper()
	doc, err := bson.Marshal(cmd)
	require.NoError(t, err)
	var b bytes.Buffer
	le := func(v any) { _ = binary.Write(&b, binary.LittleEndian, v) }
	size := wire.HeaderSize + 4 + len(ns) + 1 + 4 + 4 + len(doc)
	le(int32(size))
	le(reqID)
	le(int32(0))
	le(wire.OpQuery)
	le(int32(0)) // flags
	b.WriteString(ns)
	b.WriteByte(0)
	le(int32(0))  // numberToSkip
	le(int32(-1)) // numberToReturn
	b.Write(doc)
	_, err = nc.Write(b.Bytes())
	require.NoError(t, err)
}

// readOpReply reads one OP_REPLY and returns its header fields and document.
func readOpReply(t testing.TB, nc net.Conn) (responseTo int32, flags int32, doc bson.D) {
	t.Helper()
	hdr := make([]byte, wire.HeaderSize+20)
	_, err := io.ReadFull(nc, hdr)
	require.NoError(t, err)
	size := int32(binary.LittleEndian.Uint32(hdr[0:]))
	responseTo = int32(binary.LittleEndian.Uint32(hdr[8:]))
	require.Equal(t, wire.OpReply, int32(binary.LittleEndian.Uint32(hdr[12:])))
	flags = int32(binary.LittleEndian.Uint32(hdr[16:]))
	require.Equal(t, int32(1), int32(binary.LittleEndian.Uint32(hdr[32:])), "numberReturned")
	rest := make([]byte, int(size)-len(hdr))
	_, err = io.ReadFull(nc, rest)
	require.NoError(t, err)
	require.NoError(t, bson.Unmarshal(rest, &doc))
	return responseTo, flags, doc
}

// expectClosed asserts that the server closes nc (reads end with EOF or a
// reset, without any reply bytes).
func expectClosed(t testing.TB, nc net.Conn) {
	t.Helper()
	require.NoError(t, nc.SetReadDeadline(time.Now().Add(5*time.Second)))
	n, err := io.Copy(io.Discard, nc)
	require.Zero(t, n, "server replied instead of closing")
	if err != nil {
		var ne net.Error
		if ok := asNetErr(err, &ne); ok && ne.Timeout() {
			t.Fatalf("server did not close the connection: %v", err)
		}
	}
}

func asNetErr(err error, target *net.Error) bool {
	ne, ok := err.(net.Error)
	if ok {
		*target = ne
	}
	return ok
}

// get returns a field of a reply.
func get(d bson.D, key string) any { return lookupD(d, key) }

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
