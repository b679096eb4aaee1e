package mongofake

import (
	"encoding/binary"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/event-outbox/outbox/mongox/internal/bsonkit"
	"github.com/event-outbox/outbox/mongox/internal/wire"
)

// FuzzConnRead writes arbitrary bytes to a live server and checks that the
// server answers or closes that connection, and keeps serving others.
func FuzzConnRead(f *testing.F) {
	ping, _ := bson.Marshal(bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "admin"}})
	msg := append(append(append(append(le32(int32(16+4+1+len(ping))), le32(1)...), le32(0)...), le32(wire.OpMsg)...), append(le32(0), 0)...)
	f.Add(append(msg, ping...))
	f.Add([]byte("garbage"))
	f.Add(append(le32(16), make([]byte, 12)...))
	f.Add(append(append(append(le32(16+9), le32(1)...), le32(0)...), append(le32(wire.OpCompressed), make([]byte, 9)...)...))

	srv, err := NewServer() // no test commands: random input must not arm fail points
	require.NoError(f, err)
	f.Cleanup(func() { _ = srv.Close() })

	f.Fuzz(func(t *testing.T, data []byte) {
		nc, err := net.DialTimeout("tcp", srv.Addr(), 5*time.Second)
		require.NoError(t, err)
		defer nc.Close()
		require.NoError(t, nc.SetDeadline(time.Now().Add(10*time.Second)))
		_, _ = nc.Write(data)
		_ = nc.(*net.TCPConn).CloseWrite()
		// The server answers what it can parse and then sees EOF (or closes
		// at once); either way the read side ends, well before the deadline.
		_, err = io.Copy(io.Discard, nc)
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Fatalf("server neither answered nor closed: %v", err)
		}

		// The server still serves new connections.
		c2, err := net.DialTimeout("tcp", srv.Addr(), 5*time.Second)
		require.NoError(t, err)
		defer c2.Close()
		require.NoError(t, c2.SetDeadline(time.Now().Add(10*time.Second)))
		rawMsg(t, c2, 1, 0, bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "admin"}})
		_, reply := readMsgReply(t, c2)
		require.Equal(t, 1.0, get(reply, "ok"))
	})
}

// FuzzCommandBody frames arbitrary bytes as the body of an OP_MSG and checks
// that the server replies (or, for invalid BSON, closes the connection),
// that no handler panics, and that the server keeps serving.
func FuzzCommandBody(f *testing.F) {
	for _, cmd := range []bson.D{
		{{Key: "ping", Value: 1}, {Key: "$db", Value: "admin"}},
		{{Key: "hello", Value: 1}, {Key: "helloOk", Value: true}, {Key: "$db", Value: "admin"}},
		{{Key: "insert", Value: "c"}, {Key: "documents", Value: bson.A{bson.D{{Key: "a", Value: 1}}}}, {Key: "$db", Value: "f"}},
		{{Key: "find", Value: "c"}, {Key: "filter", Value: bson.D{{Key: "a", Value: bson.D{{Key: "$gt", Value: 0}}}}}, {Key: "$db", Value: "f"}},
		{{Key: "update", Value: "c"}, {Key: "updates", Value: bson.A{bson.D{{Key: "q", Value: bson.D{}}, {Key: "u", Value: bson.D{{Key: "$inc", Value: bson.D{{Key: "a", Value: 1}}}}}}}}, {Key: "$db", Value: "f"}},
		{{Key: "aggregate", Value: "c"}, {Key: "pipeline", Value: bson.A{bson.D{{Key: "$match", Value: bson.D{}}}}}, {Key: "cursor", Value: bson.D{}}, {Key: "$db", Value: "f"}},
		{{Key: "getParameter", Value: "*"}, {Key: "$db", Value: "admin"}},
	} {
		raw, err := bson.Marshal(cmd)
		require.NoError(f, err)
		f.Add([]byte(raw))
	}
	// A level deeper than mongod's maxBSONDepth: refused with code 15.
	deep, err := bson.Marshal(bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "admin"}})
	require.NoError(f, err)
	deep = append(append(deep[:len(deep)-1], 0x03, 'x', 0), bsonkit.NestedDocument(bsonkit.MaxWireDepth)...)
	deep = append(deep, 0)
	binary.LittleEndian.PutUint32(deep, uint32(len(deep)))
	f.Add(deep)

	srv, err := NewServer() // no test commands: random input must not arm fail points
	require.NoError(f, err)
	f.Cleanup(func() { _ = srv.Close() })

	f.Fuzz(func(t *testing.T, body []byte) {
		nc, err := net.DialTimeout("tcp", srv.Addr(), 5*time.Second)
		require.NoError(t, err)
		defer nc.Close()
		require.NoError(t, nc.SetDeadline(time.Now().Add(10*time.Second)))
		frame := append(append(append(append(le32(int32(16+4+1+len(body))), le32(1)...), le32(0)...), le32(wire.OpMsg)...), append(le32(0), 0)...)
		_, err = nc.Write(append(frame, body...))
		require.NoError(t, err)
		m, err := wire.ReadMessage(nc, 0)
		if err == nil {
			require.NotNil(t, m.Msg)
			reply, err := m.Msg.Body()
			require.NoError(t, err)
			if get(reply, "code") == int32(1) {
				msg, _ := get(reply, "errmsg").(string)
				require.NotContains(t, msg, "mongofake: internal error in command", "a handler panicked")
			}
		} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Fatalf("server neither answered nor closed: %v", err)
		}
	})
}
