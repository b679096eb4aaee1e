package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"io"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/mongo/driver/wiremessage"

	"github.com/event-outbox/outbox/mongox/internal/bsonkit"
)

func mustDoc(t testing.TB, d bson.D) []byte {
	t.Helper()
	b, err := bson.Marshal(d)
	require.NoError(t, err)
	return b
}

func le32(v uint32) []byte { return binary.LittleEndian.AppendUint32(nil, v) }

// frame prefixes payload with a header for opcode op.
func frame(reqID, respTo, op int32, payload []byte) []byte {
	b := make([]byte, 0, HeaderSize+len(payload))
	b = binary.LittleEndian.AppendUint32(b, uint32(HeaderSize+len(payload)))
	b = binary.LittleEndian.AppendUint32(b, uint32(reqID))
	b = binary.LittleEndian.AppendUint32(b, uint32(respTo))
	b = binary.LittleEndian.AppendUint32(b, uint32(op))
	return append(b, payload...)
}

func section0(doc []byte) []byte { return append([]byte{0}, doc...) }

func section1(id string, docs ...[]byte) []byte {
	var body []byte
	body = append(body, id...)
	body = append(body, 0)
	for _, d := range docs {
		body = append(body, d...)
	}
	out := []byte{1}
	out = append(out, le32(uint32(4+len(body)))...)
	return append(out, body...)
}

func opMsg(flags uint32, sections ...[]byte) []byte {
	p := le32(flags)
	for _, s := range sections {
		p = append(p, s...)
	}
	return frame(7, 0, OpMsg, p)
}

// withChecksum sets the checksum flag and appends a correct CRC-32C.
func withChecksum(msg []byte) []byte {
	out := append([]byte(nil), msg...)
	flags := binary.LittleEndian.Uint32(out[16:]) | FlagChecksumPresent
	binary.LittleEndian.PutUint32(out[16:], flags)
	binary.LittleEndian.PutUint32(out[0:], uint32(len(out)+4))
	sum := crc32.Checksum(out, crc32.MakeTable(crc32.Castagnoli))
	return append(out, le32(sum)...)
}

func opQuery(t testing.TB, ns string, query []byte, extra ...[]byte) []byte {
	t.Helper()
	p := le32(4) // slaveOk
	p = append(p, ns...)
	p = append(p, 0)
	p = append(p, le32(0)...)
	p = append(p, le32(uint32(0xffffffff))...) // -1
	p = append(p, query...)
	for _, e := range extra {
		p = append(p, e...)
	}
	return frame(3, 0, OpQuery, p)
}

func TestReadOpMsgBodyAndSequences(t *testing.T) {
	t.Parallel()
	body := mustDoc(t, bson.D{{Key: "insert", Value: "c"}, {Key: "$db", Value: "test"}})
	d1 := mustDoc(t, bson.D{{Key: "_id", Value: int32(1)}})
	d2 := mustDoc(t, bson.D{{Key: "_id", Value: int32(2)}, {Key: "x", Value: "y"}})
	raw := opMsg(FlagExhaustAllowed, section1("documents", d1, d2), section0(body), section1("empty"))

	m, err := ReadMessage(bytes.NewReader(raw), 0)
	require.NoError(t, err)
	require.Equal(t, Header{MessageLength: int32(len(raw)), RequestID: 7, OpCode: OpMsg}, m.Header)
	require.Nil(t, m.Query)
	require.NotNil(t, m.Msg)
	require.True(t, m.Msg.ExhaustAllowed())
	require.False(t, m.Msg.MoreToCome())
	require.Equal(t, bson.Raw(body), m.Msg.Document)
	require.Len(t, m.Msg.Sequences, 2)
	require.Equal(t, "documents", m.Msg.Sequences[0].Identifier)
	require.Equal(t, []bson.Raw{d1, d2}, m.Msg.Sequences[0].Documents)
	require.Equal(t, "empty", m.Msg.Sequences[1].Identifier)
	require.Empty(t, m.Msg.Sequences[1].Documents)

	cmd, err := m.Msg.Body()
	require.NoError(t, err)
	require.Equal(t, bson.D{
		{Key: "insert", Value: "c"},
		{Key: "$db", Value: "test"},
		{Key: "documents", Value: bson.A{
			bson.D{{Key: "_id", Value: int32(1)}},
			bson.D{{Key: "_id", Value: int32(2)}, {Key: "x", Value: "y"}},
		}},
		{Key: "empty", Value: bson.A{}},
	}, cmd)
}

func TestReadOpMsgChecksum(t *testing.T) {
	t.Parallel()
	body := mustDoc(t, bson.D{{Key: "ping", Value: int32(1)}})
	raw := withChecksum(opMsg(FlagMoreToCome, section0(body)))
	m, err := ReadMessage(bytes.NewReader(raw), 0)
	require.NoError(t, err)
	require.True(t, m.Msg.MoreToCome())
	require.Equal(t, binary.LittleEndian.Uint32(raw[len(raw)-4:]), m.Msg.Checksum)
	require.Equal(t, bson.Raw(body), m.Msg.Document)

	bad := append([]byte(nil), raw...)
	bad[len(bad)-1] ^= 0xff
	_, err = ReadMessage(bytes.NewReader(bad), 0)
	require.ErrorIs(t, err, ErrMalformed)
	require.ErrorContains(t, err, "checksum mismatch")
}

func TestReadOpQuery(t *testing.T) {
	t.Parallel()
	q := mustDoc(t, bson.D{{Key: "isMaster", Value: int32(1)}})
	sel := mustDoc(t, bson.D{{Key: "a", Value: int32(1)}})

	m, err := ReadMessage(bytes.NewReader(opQuery(t, "admin.$cmd", q)), 0)
	require.NoError(t, err)
	require.Nil(t, m.Msg)
	require.Equal(t, &Query{Flags: 4, FullCollectionName: "admin.$cmd", NumberToReturn: -1, Query: q}, m.Query)

	m, err = ReadMessage(bytes.NewReader(opQuery(t, "db.coll", q, sel)), 0)
	require.NoError(t, err)
	require.Equal(t, bson.Raw(sel), m.Query.ReturnFieldsSelector)
}

func TestReadSequentialMessagesAndEOF(t *testing.T) {
	t.Parallel()
	body := mustDoc(t, bson.D{{Key: "ping", Value: int32(1)}})
	var stream bytes.Buffer
	stream.Write(opMsg(0, section0(body)))
	stream.Write(opQuery(t, "admin.$cmd", body))
	r := bytes.NewReader(stream.Bytes())
	m, err := ReadMessage(r, 0)
	require.NoError(t, err)
	require.NotNil(t, m.Msg)
	m, err = ReadMessage(r, 0)
	require.NoError(t, err)
	require.NotNil(t, m.Query)
	_, err = ReadMessage(r, 0)
	require.ErrorIs(t, err, io.EOF)
}

func TestReadStreamStaysInStepAfterContentErrors(t *testing.T) {
	t.Parallel()
	body := mustDoc(t, bson.D{{Key: "ping", Value: int32(1)}})
	var stream bytes.Buffer
	stream.Write(opMsg(0, []byte{9}))                  // bad section kind
	stream.Write(frame(1, 0, OpCompressed, []byte{1})) // compressed
	stream.Write(frame(1, 0, 2010, nil))               // OP_GET_MORE era opcode
	stream.Write(opMsg(0, section0(body)))
	r := bytes.NewReader(stream.Bytes())

	_, err := ReadMessage(r, 0)
	require.ErrorIs(t, err, ErrMalformed)
	_, err = ReadMessage(r, 0)
	require.ErrorIs(t, err, ErrCompressed)
	var oe *OpCodeError
	require.ErrorAs(t, err, &oe)
	require.Equal(t, OpCompressed, oe.Header.OpCode)
	_, err = ReadMessage(r, 0)
	require.ErrorIs(t, err, ErrUnsupportedOpCode)
	require.ErrorContains(t, err, "2010")
	m, err := ReadMessage(r, 0)
	require.NoError(t, err)
	require.Equal(t, bson.Raw(body), m.Msg.Document)
}

func TestReadMalformed(t *testing.T) {
	t.Parallel()
	body := mustDoc(t, bson.D{{Key: "ping", Value: int32(1)}})
	q := mustDoc(t, bson.D{{Key: "isMaster", Value: int32(1)}})
	// A document whose declared length runs past the section.
	overrun := append([]byte(nil), body...)
	binary.LittleEndian.PutUint32(overrun, uint32(len(body)+10))
	// A document whose last byte is not NUL.
	noNul := append([]byte(nil), body...)
	noNul[len(noNul)-1] = 1
	// A document with a length below the BSON minimum.
	tiny := []byte{4, 0, 0, 0}

	cases := []struct {
		name string
		raw  []byte
		err  error
		msg  string
	}{
		{"length below header", append(le32(15), make([]byte, 12)...), ErrFraming, "shorter than"},
		{"negative length", append(le32(0xffffffff), make([]byte, 12)...), ErrFraming, "shorter than"},
		{"too large", append(le32(1<<20), make([]byte, 12)...), ErrTooLarge, "exceeds"},
		{"msg no flags", frame(1, 0, OpMsg, []byte{1, 0}), ErrMalformed, "flagBits"},
		{"msg no sections", opMsg(0), ErrMalformed, "no body"},
		{"msg unknown required flag", opMsg(1<<2, section0(body)), ErrMalformed, "unknown required flag"},
		{"msg unknown required flag 15", opMsg(1<<15, section0(body)), ErrMalformed, "unknown required flag"},
		{"msg bad section kind", opMsg(0, section0(body), []byte{2}), ErrMalformed, "section kind 2"},
		{"msg two bodies", opMsg(0, section0(body), section0(body)), ErrMalformed, "more than one body"},
		{"msg only sequence", opMsg(0, section1("documents", body)), ErrMalformed, "no body"},
		{"msg body overrun", opMsg(0, section0(overrun)), ErrMalformed, "out of range"},
		{"msg body no nul", opMsg(0, section0(noNul)), ErrMalformed, "invalid BSON"},
		{"msg body tiny", opMsg(0, section0(tiny)), ErrMalformed, "out of range"},
		{"msg body truncated length", opMsg(0, []byte{0, 5, 0}), ErrMalformed, "too short"},
		{"msg seq truncated size", opMsg(0, section0(body), []byte{1, 5, 0}), ErrMalformed, "too short"},
		{"msg seq size overrun", opMsg(0, section0(body), []byte{1, 100, 0, 0, 0, 'a', 0}), ErrMalformed, "out of range"},
		{"msg seq size too small", opMsg(0, section0(body), []byte{1, 4, 0, 0, 0}), ErrMalformed, "out of range"},
		{"msg seq identifier no nul", opMsg(0, section0(body), []byte{1, 6, 0, 0, 0, 'a', 'b'}), ErrMalformed, "NUL"},
		{"msg seq doc overrun", opMsg(0, section0(body), section1("d", overrun)), ErrMalformed, "out of range"},
		{"msg seq partial doc", opMsg(0, section0(body), section1("d", body[:3])), ErrMalformed, "too short"},
		{"msg checksum no room", frame(1, 0, OpMsg, append(le32(1), 0, 0)), ErrMalformed, "no room"},
		{"query short", frame(1, 0, OpQuery, []byte{0}), ErrMalformed, "flags"},
		{"query name no nul", frame(1, 0, OpQuery, append(le32(0), 'a', 'b')), ErrMalformed, "NUL"},
		{"query no skip", frame(1, 0, OpQuery, append(le32(0), 'a', 0, 1)), ErrMalformed, "numberToSkip"},
		{"query no doc", opQuery(t, "a.$cmd", nil), ErrMalformed, "too short"},
		{"query doc overrun", opQuery(t, "a.$cmd", overrun), ErrMalformed, "out of range"},
		{"query trailing", opQuery(t, "a.$cmd", q, q, []byte{1}), ErrMalformed, "trailing"},
		{"query bad selector", opQuery(t, "a.$cmd", q, []byte{1, 2}), ErrMalformed, "returnFieldsSelector"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := ReadMessage(bytes.NewReader(tc.raw), 1000)
			require.ErrorIs(t, err, tc.err)
			require.ErrorContains(t, err, tc.msg)
		})
	}
}

func TestReadTruncatedStream(t *testing.T) {
	t.Parallel()
	body := mustDoc(t, bson.D{{Key: "ping", Value: int32(1)}})
	raw := opMsg(0, section0(body))
	for n := 1; n < len(raw); n++ {
		_, err := ReadMessage(bytes.NewReader(raw[:n]), 0)
		require.ErrorIs(t, err, io.ErrUnexpectedEOF, "cut at %d", n)
	}
}

func TestReadLargeDeclaredLengthDoesNotPreallocate(t *testing.T) {
	// Not parallel: it measures allocated bytes.
	// Declares 40 MB but delivers a few bytes: must fail without
	// allocating the declared size up front.
	raw := frame(1, 0, OpMsg, []byte{0, 0, 0, 0})
	binary.LittleEndian.PutUint32(raw, 40_000_000)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := ReadMessage(bytes.NewReader(raw), 0)
	runtime.ReadMemStats(&after)
	require.ErrorIs(t, err, io.ErrUnexpectedEOF)
	require.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(4<<20))

	// A genuinely large message above the direct-allocation limit reads fine.
	big := mustDoc(t, bson.D{{Key: "insert", Value: "c"}, {Key: "pad", Value: strings.Repeat("x", 3<<20)}})
	m, err := ReadMessage(bytes.NewReader(opMsg(0, section0(big))), 0)
	require.NoError(t, err)
	require.Equal(t, bson.Raw(big), m.Msg.Document)
}

func TestBodyDuplicateIdentifier(t *testing.T) {
	t.Parallel()
	body := mustDoc(t, bson.D{{Key: "insert", Value: "c"}, {Key: "documents", Value: bson.A{}}})
	m, err := ReadMessage(bytes.NewReader(opMsg(0, section0(body), section1("documents"))), 0)
	require.NoError(t, err)
	_, err = m.Msg.Body()
	require.ErrorIs(t, err, ErrMalformed)
	require.ErrorContains(t, err, `"documents" duplicates`)
}

func TestWriteMsgRoundTrip(t *testing.T) {
	t.Parallel()
	body := mustDoc(t, bson.D{{Key: "ok", Value: 1.0}})
	var buf countingWriter
	require.NoError(t, WriteMsg(&buf, 11, 7, FlagMoreToCome, body))
	require.Equal(t, 1, buf.writes)

	m, err := ReadMessage(bytes.NewReader(buf.Bytes()), 0)
	require.NoError(t, err)
	require.Equal(t, Header{MessageLength: int32(buf.Len()), RequestID: 11, ResponseTo: 7, OpCode: OpMsg}, m.Header)
	require.Equal(t, FlagMoreToCome, m.Msg.FlagBits)
	require.Equal(t, bson.Raw(body), m.Msg.Document)
	require.Empty(t, m.Msg.Sequences)
	require.True(t, wiremessage.IsMsgMoreToCome(buf.Bytes()))

	require.Error(t, WriteMsg(&buf, 1, 1, FlagChecksumPresent, body))
	require.Error(t, WriteMsg(&buf, 1, 1, 0, body[:len(body)-1]))
	require.Error(t, WriteMsg(&buf, 1, 1, 0, nil))
}

func TestWriteReplyMatchesDriverDecoder(t *testing.T) {
	t.Parallel()
	doc := mustDoc(t, bson.D{{Key: "ismaster", Value: true}, {Key: "ok", Value: 1.0}})
	var buf countingWriter
	require.NoError(t, WriteReply(&buf, 5, 3, doc))
	require.Equal(t, 1, buf.writes)

	length, reqID, respTo, op, rem, ok := wiremessage.ReadHeader(buf.Bytes())
	require.True(t, ok)
	require.Equal(t, int32(buf.Len()), length)
	require.Equal(t, int32(5), reqID)
	require.Equal(t, int32(3), respTo)
	require.Equal(t, wiremessage.OpReply, op)
	flags, rem, ok := wiremessage.ReadReplyFlags(rem)
	require.True(t, ok)
	require.Equal(t, wiremessage.ReplyFlag(AwaitCapable), flags)
	cursorID, rem, ok := wiremessage.ReadReplyCursorID(rem)
	require.True(t, ok)
	require.Zero(t, cursorID)
	from, rem, ok := wiremessage.ReadReplyStartingFrom(rem)
	require.True(t, ok)
	require.Zero(t, from)
	n, rem, ok := wiremessage.ReadReplyNumberReturned(rem)
	require.True(t, ok)
	require.Equal(t, int32(1), n)
	docs, rem, ok := wiremessage.ReadReplyDocuments(rem)
	require.True(t, ok)
	require.Empty(t, rem)
	require.Len(t, docs, 1)
	require.Equal(t, doc, []byte(docs[0]))

	require.Error(t, WriteReply(&buf, 1, 1, []byte{1, 2, 3}))
}

func TestWriteErrorPropagates(t *testing.T) {
	t.Parallel()
	body := mustDoc(t, bson.D{{Key: "ok", Value: 1.0}})
	boom := errors.New("boom")
	require.ErrorIs(t, WriteMsg(failWriter{boom}, 1, 1, 0, body), boom)
	require.ErrorIs(t, WriteReply(failWriter{boom}, 1, 1, body), boom)
}

type countingWriter struct {
	bytes.Buffer
	writes int
}

func (w *countingWriter) Write(p []byte) (int, error) {
	w.writes++
	return w.Buffer.Write(p)
}

type failWriter struct{ err error }

func (w failWriter) Write([]byte) (int, error) { return 0, w.err }

func TestMessageBody(t *testing.T) {
	t.Parallel()
	plain := mustDoc(t, bson.D{{Key: "isMaster", Value: int32(1)}})
	wrapped := mustDoc(t, bson.D{
		{Key: "$query", Value: bson.D{{Key: "isMaster", Value: int32(1)}}},
		{Key: "$readPreference", Value: bson.D{{Key: "mode", Value: "primaryPreferred"}}},
	})
	for _, q := range [][]byte{plain, wrapped} {
		m, err := ReadMessage(bytes.NewReader(opQuery(t, "admin.$cmd", q)), 0)
		require.NoError(t, err)
		body, err := m.Body()
		require.NoError(t, err)
		require.Equal(t, bson.D{{Key: "isMaster", Value: int32(1)}}, body)
	}
	m, err := ReadMessage(bytes.NewReader(opMsg(0, section0(plain), section1("d", plain))), 0)
	require.NoError(t, err)
	body, err := m.Body()
	require.NoError(t, err)
	require.Equal(t, bson.D{{Key: "isMaster", Value: int32(1)}, {Key: "d", Value: bson.A{bson.D{{Key: "isMaster", Value: int32(1)}}}}}, body)
	_, err = (&Message{}).Body()
	require.ErrorIs(t, err, ErrMalformed)
}

// TestReaderReusesBufferBodiesSurvive: a Reader reads message after message
// into one buffer; the bodies decoded from earlier messages keep their
// values (they share no memory with the buffer).
func TestReaderReusesBufferBodiesSurvive(t *testing.T) {
	t.Parallel()
	var stream bytes.Buffer
	for i := range 3 {
		body := mustDoc(t, bson.D{{Key: "insert", Value: "c" + string(rune('a'+i))}, {Key: "$db", Value: "test"}})
		doc := mustDoc(t, bson.D{{Key: "_id", Value: int32(i)}, {Key: "b", Value: bson.Binary{Data: []byte{byte(i)}}}})
		stream.Write(opMsg(0, section0(body), section1("documents", doc)))
	}
	rd := NewReader(&stream, 0)
	var bodies []bson.D
	for range 3 {
		m, err := rd.Next()
		require.NoError(t, err)
		b, err := m.Msg.BodyWith(&bsonkit.Decoder{})
		require.NoError(t, err)
		bodies = append(bodies, b)
	}
	_, err := rd.Next()
	require.ErrorIs(t, err, io.EOF)
	for i, b := range bodies {
		require.Equal(t, bson.D{
			{Key: "insert", Value: "c" + string(rune('a'+i))}, {Key: "$db", Value: "test"},
			{Key: "documents", Value: bson.A{bson.D{{Key: "_id", Value: int32(i)}, {Key: "b", Value: bson.Binary{Data: []byte{byte(i)}}}}}},
		}, b)
	}
}

// embed returns {ping: 1, x: doc}: one level more than doc.
func embed(doc []byte) []byte {
	b := le32(0)
	b = append(b, 0x10, 'p', 'i', 'n', 'g', 0, 1, 0, 0, 0)
	b = append(b, 0x03, 'x', 0)
	b = append(append(b, doc...), 0)
	binary.LittleEndian.PutUint32(b, uint32(len(b)))
	return b
}

// A document nested deeper than mongod's maxBSONDepth (200 levels below
// the top level) is refused before anything decodes it, in every place a
// message carries one, with the header and flags to answer it by; the
// stream stays in step. 200 levels pass and decode.
func TestReadRefusesDocumentsNestedTooDeep(t *testing.T) {
	t.Parallel()
	ok := embed(bsonkit.NestedDocument(bsonkit.MaxWireDepth - 1))
	deep := embed(bsonkit.NestedDocument(bsonkit.MaxWireDepth))
	body := mustDoc(t, bson.D{{Key: "insert", Value: "c"}})

	m, err := ReadMessage(bytes.NewReader(opMsg(0, section0(ok))), 0)
	require.NoError(t, err)
	_, err = m.Msg.Body()
	require.NoError(t, err)
	m, err = ReadMessage(bytes.NewReader(opQuery(t, "admin.$cmd", ok)), 0)
	require.NoError(t, err)
	_, err = m.Body()
	require.NoError(t, err)

	for name, c := range map[string]struct {
		raw   []byte
		where string
		flags uint32
	}{
		"body":     {opMsg(FlagExhaustAllowed, section0(deep)), "OP_MSG body section", FlagExhaustAllowed},
		"sequence": {opMsg(FlagMoreToCome, section0(body), section1("documents", ok, deep)), `OP_MSG document sequence "documents"`, FlagMoreToCome},
		"query":    {opQuery(t, "admin.$cmd", deep), "OP_QUERY query", 0},
		"selector": {opQuery(t, "db.c", body, deep), "OP_QUERY returnFieldsSelector", 0},
	} {
		var stream bytes.Buffer
		stream.Write(c.raw)
		stream.Write(opMsg(0, section0(body)))
		rd := NewReader(&stream, 0)
		_, err := rd.Next()
		require.ErrorIs(t, err, ErrTooDeep, name)
		var de *DepthError
		require.ErrorAs(t, err, &de, name)
		require.Equal(t, int32(len(c.raw)), de.Header.MessageLength, name)
		require.Equal(t, c.flags, de.FlagBits, name)
		require.Equal(t, bsonkit.MaxWireDepth, de.Limit, name)
		require.Contains(t, de.Error(), c.where, name)
		require.Contains(t, de.Error(), "exceeds maximum nested object depth", name)
		m, err := rd.Next()
		require.NoError(t, err, name)
		require.Equal(t, bson.Raw(body), m.Msg.Document, name)
	}
}

// The attack: a 14 MB document nested 2,000,000 levels deep, under the
// 48 MB message limit. It used to overflow the goroutine stack in the
// decoder (a fatal error that killed the whole process); it is refused.
func TestReadRefusesTwoMillionLevels(t *testing.T) {
	t.Parallel()
	doc := bsonkit.NestedDocument(2_000_000)
	for name, raw := range map[string][]byte{"OP_MSG": opMsg(0, section0(doc)), "OP_QUERY": opQuery(t, "admin.$cmd", doc)} {
		m, err := ReadMessage(bytes.NewReader(raw), 0)
		if err == nil {
			_, err = m.Body() // what the server does next
		}
		require.ErrorIs(t, err, ErrTooDeep, name)
	}
}
