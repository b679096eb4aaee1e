package wire

import (
	"bytes"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/event-outbox/outbox/mongox/internal/bsonkit"
)

func FuzzReadMessage(f *testing.F) {
	body := mustDoc(f, bson.D{{Key: "insert", Value: "c"}, {Key: "$db", Value: "test"}, {Key: "lsid", Value: bson.D{{Key: "id", Value: bson.Binary{Subtype: 4, Data: make([]byte, 16)}}}}})
	d1 := mustDoc(f, bson.D{{Key: "_id", Value: int32(1)}, {Key: "a", Value: bson.A{1.5, "x", nil}}})
	q := mustDoc(f, bson.D{{Key: "isMaster", Value: int32(1)}, {Key: "client", Value: bson.D{{Key: "driver", Value: "go"}}}})
	f.Add(opMsg(0, section0(body)))
	f.Add(opMsg(FlagExhaustAllowed, section0(body), section1("documents", d1, d1)))
	f.Add(withChecksum(opMsg(FlagMoreToCome, section1("updates", d1), section0(body))))
	f.Add(opQuery(f, "admin.$cmd", q))
	f.Add(opQuery(f, "db.coll", q, d1))
	f.Add(frame(1, 0, OpCompressed, []byte{1, 2, 3}))
	f.Add(opMsg(0, section0(bsonkit.NestedDocument(bsonkit.MaxWireDepth+1))))
	f.Add(opQuery(f, "admin.$cmd", bsonkit.NestedDocument(bsonkit.MaxWireDepth)))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := ReadMessage(bytes.NewReader(data), 1<<16)
		var de *DepthError
		if errors.As(err, &de) {
			require.GreaterOrEqual(t, len(data), int(de.Header.MessageLength))
		}
		if err != nil {
			return
		}
		require.GreaterOrEqual(t, int(m.Header.MessageLength), HeaderSize)
		require.LessOrEqual(t, int(m.Header.MessageLength), len(data))
		switch {
		case m.Msg != nil:
			cmd, err := m.Msg.Body()
			if err != nil {
				return
			}
			// A decoded command re-encodes and frames again.
			raw, err := bson.Marshal(cmd)
			if err != nil {
				return // e.g. keys bson.Marshal rejects; not the framer's concern
			}
			var buf bytes.Buffer
			require.NoError(t, WriteMsg(&buf, m.Header.RequestID, 0, m.Msg.FlagBits&^FlagChecksumPresent, raw))
			again, err := ReadMessage(&buf, 0)
			require.NoError(t, err)
			require.Equal(t, bson.Raw(raw), again.Msg.Document)
		case m.Query != nil:
			var d bson.D
			_ = bson.Unmarshal(m.Query.Query, &d)
		default:
			t.Fatal("message with neither payload")
		}
	})
}
