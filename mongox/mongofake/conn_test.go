package mongofake

import (
	"encoding/binary"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/event-outbox/outbox/mongox/internal/bsonkit"
	"github.com/event-outbox/outbox/mongox/internal/wire"
)

func TestLegacyOpQueryHandshake(t *testing.T) {
	t.Parallel()
	srv := newTestServer(t)
	nc := rawDial(t, srv)

	rawQuery(t, nc, 11, "admin.$cmd", bson.D{{Key: "isMaster", Value: 1}, {Key: "helloOk", Value: true},
		{Key: "client", Value: bson.D{{Key: "application", Value: bson.D{{Key: "name", Value: "legacy-app"}}}}}})
	responseTo, flags, reply := readOpReply(t, nc)
	require.Equal(t, int32(11), responseTo)
	require.Equal(t, wire.AwaitCapable, flags)
	require.Equal(t, true, get(reply, "ismaster"))
	require.Equal(t, true, get(reply, "helloOk"))
	require.Equal(t, 1.0, get(reply, "ok"))

	// Wrapped form and another command through OP_QUERY, $db from the namespace.
	rawQuery(t, nc, 12, "mydb.$cmd", bson.D{{Key: "$query", Value: bson.D{{Key: "ping", Value: 1}}}})
	_, _, reply = readOpReply(t, nc)
	require.Equal(t, 1.0, get(reply, "ok"))
	rawQuery(t, nc, 13, "mydb.$cmd", bson.D{{Key: "getParameter", Value: 1}, {Key: "featureCompatibilityVersion", Value: 1}})
	_, _, reply = readOpReply(t, nc)
	require.Equal(t, int32(13), get(reply, "code"), "getParameter on mydb must be refused as admin-only")

	// A legacy query on a collection is refused with a clear error.
	rawQuery(t, nc, 14, "mydb.coll", bson.D{{Key: "a", Value: 1}})
	_, _, reply = readOpReply(t, nc)
	require.Equal(t, int32(352), get(reply, "code"))

	// The connection still works with OP_MSG, and the app name was recorded.
	rawMsg(t, nc, 15, 0, bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "admin"}})
	m, reply := readMsgReply(t, nc)
	require.Equal(t, int32(15), m.Header.ResponseTo)
	require.Equal(t, 1.0, get(reply, "ok"))
}

func TestMoreToComeGetsNoReply(t *testing.T) {
	t.Parallel()
	srv := newTestServer(t)
	nc := rawDial(t, srv)
	rawMsg(t, nc, 1, wire.FlagMoreToCome, bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "admin"}})
	rawMsg(t, nc, 2, wire.FlagMoreToCome, bson.D{{Key: "nosuchcommand", Value: 1}, {Key: "$db", Value: "admin"}})
	rawMsg(t, nc, 3, 0, bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "admin"}})
	m, _ := readMsgReply(t, nc)
	require.Equal(t, int32(3), m.Header.ResponseTo, "only the acknowledged request gets a reply")
	require.Zero(t, m.Msg.FlagBits&wire.FlagChecksumPresent)
}

func TestDocumentSequencesMerged(t *testing.T) {
	t.Parallel()
	srv := newTestServer(t)
	nc := rawDial(t, srv)
	// OP_MSG with a kind-1 section for a command that does not expect one:
	// the dispatcher still parses it (the handler ignores unknown fields).
	body, err := bson.Marshal(bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "admin"}})
	require.NoError(t, err)
	doc, err := bson.Marshal(bson.D{{Key: "x", Value: 1}})
	require.NoError(t, err)
	seq := append([]byte{1}, le32(int32(4+len("documents")+1+len(doc)))...)
	seq = append(append(append(seq, "documents"...), 0), doc...)
	payload := append(append(le32(0), 0), body...)
	payload = append(payload, seq...)
	frame := append(append(append(le32(int32(16+len(payload))), le32(5)...), le32(0)...), le32(wire.OpMsg)...)
	_, err = nc.Write(append(frame, payload...))
	require.NoError(t, err)
	_, reply := readMsgReply(t, nc)
	require.Equal(t, 1.0, get(reply, "ok"))
}

func TestMalformedMessagesCloseOnlyThatConnection(t *testing.T) {
	t.Parallel()
	srv, client := setup(t)
	cases := map[string][]byte{
		"garbage":        []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"),
		"short length":   append(le32(3), make([]byte, 12)...),
		"huge length":    append(le32(1<<30), make([]byte, 12)...),
		"compressed":     append(append(append(le32(16+9), le32(1)...), le32(0)...), append(le32(wire.OpCompressed), make([]byte, 9)...)...),
		"unknown opcode": append(append(append(le32(16), le32(1)...), le32(0)...), le32(2004+100)...),
		"bad bson":       append(append(append(le32(16+4+1+5), le32(1)...), le32(0)...), append(append(le32(wire.OpMsg), le32(0)...), 0, 9, 0, 0, 0, 0)...),
	}
	for name, b := range cases {
		t.Run(name, func(t *testing.T) {
			nc := rawDial(t, srv)
			_, err := nc.Write(b)
			require.NoError(t, err)
			expectClosed(t, nc)
		})
	}
	require.NoError(t, client.Ping(testCtx(t), nil))
}

func le32(v int32) []byte {
	b := make([]byte, 4)
	binary.LittleEndian.PutUint32(b, uint32(v))
	return b
}

// withNested returns cmd encoded with one more field, x, holding doc.
func withNested(t *testing.T, cmd bson.D, doc []byte) []byte {
	t.Helper()
	raw, err := bson.Marshal(cmd)
	require.NoError(t, err)
	raw = append(raw[:len(raw)-1], 0x03, 'x', 0)
	raw = append(append(raw, doc...), 0)
	binary.LittleEndian.PutUint32(raw, uint32(len(raw)))
	return raw
}

// One unauthenticated message nesting a document 2,000,000 levels deep
// (14 MB) used to overflow the server's stack, a fatal error that took the
// whole process down. mongod refuses a document nested deeper than
// maxBSONDepth (200) on receipt with code 15, Overflow, and so does the
// server, on OP_MSG and OP_QUERY alike, keeping the connection.
func TestDocumentsNestedTooDeepAreRefused(t *testing.T) {
	t.Parallel()
	srv, client := setup(t)
	nc := rawDial(t, srv)
	require.NoError(t, nc.SetDeadline(time.Now().Add(60*time.Second)))
	deep := bsonkit.NestedDocument(2_000_000)
	ping := bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "admin"}}

	require.NoError(t, wire.WriteMsg(nc, 21, 0, 0, withNested(t, ping, deep)))
	m, reply := readMsgReply(t, nc)
	require.Equal(t, int32(21), m.Header.ResponseTo)
	require.Equal(t, 0.0, get(reply, "ok"))
	require.Equal(t, int32(15), get(reply, "code"))
	require.Equal(t, "Overflow", get(reply, "codeName"))
	require.Contains(t, get(reply, "errmsg"), "exceeds maximum nested object depth")

	// Unacknowledged: no reply, and the connection goes on.
	require.NoError(t, wire.WriteMsg(nc, 22, 0, wire.FlagMoreToCome, withNested(t, ping, deep)))
	q := withNested(t, bson.D{{Key: "isMaster", Value: 1}}, deep)
	b := le32(int32(wire.HeaderSize + 4 + len("admin.$cmd") + 1 + 8 + len(q)))
	b = append(append(append(b, le32(23)...), le32(0)...), le32(wire.OpQuery)...)
	b = append(append(append(append(b, le32(0)...), "admin.$cmd"...), 0), le32(0)...)
	b = append(append(b, le32(-1)...), q...)
	_, err := nc.Write(b)
	require.NoError(t, err)
	responseTo, _, legacy := readOpReply(t, nc)
	require.Equal(t, int32(23), responseTo)
	require.Equal(t, int32(15), get(legacy, "code"))

	rawMsg(t, nc, 24, 0, ping)
	m, reply = readMsgReply(t, nc)
	require.Equal(t, int32(24), m.Header.ResponseTo)
	require.Equal(t, 1.0, get(reply, "ok"))

	// Through the driver: 200 levels below a document pass the wire, 201
	// do not.
	nest := func(levels int) bson.D {
		d := bson.D{{Key: "v", Value: 1}}
		for range levels {
			d = bson.D{{Key: "a", Value: d}}
		}
		return d
	}
	coll := client.Database("deep").Collection("c")
	_, err = coll.InsertOne(testCtx(t), append(nest(199), bson.E{Key: "_id", Value: 1}))
	require.NoError(t, err)
	_, err = coll.InsertOne(testCtx(t), append(nest(201), bson.E{Key: "_id", Value: 2}))
	var ce mongo.CommandError
	require.ErrorAs(t, err, &ce)
	require.Equal(t, int32(15), ce.Code)
	require.NoError(t, client.Ping(testCtx(t), nil))
}
