package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/event-outbox/outbox/mongox/internal/bsonkit"
)

// Opcodes of the wire protocol messages this package knows.
const (
	OpReply      int32 = 1    // OP_REPLY: legacy reply to OP_QUERY.
	OpQuery      int32 = 2004 // OP_QUERY: legacy query, still used for the first hello.
	OpCompressed int32 = 2012 // OP_COMPRESSED: never accepted (no compressor is advertised).
	OpMsg        int32 = 2013 // OP_MSG: the extensible message format.
)

// OP_MSG flag bits.
const (
	FlagChecksumPresent uint32 = 1 << 0  // the message ends with a CRC-32C checksum
	FlagMoreToCome      uint32 = 1 << 1  // the sender will not wait for a reply (or more replies follow)
	FlagExhaustAllowed  uint32 = 1 << 16 // the client accepts moreToCome replies
)

// requiredFlagMask covers the OP_MSG flag bits 0-15 a receiver must
// understand; bits 16-31 are optional and ignored when unknown.
const requiredFlagMask uint32 = 0xffff

// HeaderSize is the size of the standard message header in bytes.
const HeaderSize = 16

// DefaultMaxMessageSize is the size limit ReadMessage applies when maxSize
// is zero or negative: 48 MB, MongoDB's maxMessageSizeBytes.
const DefaultMaxMessageSize = 48_000_000

// AwaitCapable is the OP_REPLY responseFlags bit MongoDB sets on every reply.
const AwaitCapable int32 = 8

// Errors. Errors that wrap ErrMalformed, ErrCompressed or
// ErrUnsupportedOpCode are returned after the whole message was consumed.
var (
	// ErrMalformed is wrapped by every error describing a message whose
	// content does not follow the protocol.
	ErrMalformed = errors.New("wire: malformed message")
	// ErrCompressed reports an OP_COMPRESSED message. This server never
	// advertises a compressor, so a client must not send one.
	ErrCompressed = errors.New("wire: OP_COMPRESSED is not supported (no compressor was negotiated)")
	// ErrUnsupportedOpCode reports a message with an opcode other than
	// OP_MSG and OP_QUERY.
	ErrUnsupportedOpCode = errors.New("wire: unsupported opcode")
	// ErrFraming is wrapped by errors about a message length that cannot
	// be honoured (shorter than the header, or above the size limit). The
	// message body was not read: the stream is out of step and the
	// connection must be closed.
	ErrFraming = errors.New("wire: bad message length")
	// ErrTooLarge reports a declared message length above the size limit
	// (it comes wrapped together with ErrFraming).
	ErrTooLarge = errors.New("wire: message too large")
	// ErrTooDeep is wrapped by a *DepthError: a message holding a document
	// nested deeper than bsonkit.MaxWireDepth.
	ErrTooDeep = errors.New("wire: document nested too deep")
)

// DepthError reports a well-framed message holding a document that nests
// embedded documents and arrays more than Limit levels deep. Its depth was
// measured on the raw bytes before anything decoded them (a recursive
// decoder would exhaust the goroutine stack on millions of levels, a fatal
// error no recover catches). The message has been consumed and the stream
// is in step: the server answers with an error, as mongod does (code 15,
// Overflow), and keeps the connection.
type DepthError struct {
	Header Header
	// FlagBits are the OP_MSG flag bits (0 for OP_QUERY); with
	// FlagMoreToCome the client reads no reply.
	FlagBits uint32
	// Where names the document ("OP_MSG body section", ...).
	Where string
	// Limit is the number of levels allowed below a top-level document.
	Limit int
}

// Error implements error, with mongod's wording.
func (e *DepthError) Error() string {
	return fmt.Sprintf("BSONObj exceeds maximum nested object depth: the %s nests documents and arrays more than %d levels deep",
		e.Where, e.Limit)
}

// Unwrap returns ErrTooDeep.
func (e *DepthError) Unwrap() error { return ErrTooDeep }

// Header is the standard header that starts every message.
type Header struct {
	MessageLength int32 // total message size in bytes, header included
	RequestID     int32 // identifier chosen by the sender
	ResponseTo    int32 // RequestID of the request this message answers
	OpCode        int32 // message type
}

// Message is one decoded message. Exactly one of Msg and Query is set.
type Message struct {
	Header Header
	Msg    *Msg   // set for OP_MSG
	Query  *Query // set for OP_QUERY
}

// Msg is the payload of an OP_MSG message.
type Msg struct {
	FlagBits uint32
	// Document is the single kind-0 (body) section.
	Document bson.Raw
	// Sequences are the kind-1 (document sequence) sections, in order.
	Sequences []Sequence
	// Checksum is the CRC-32C checksum, verified, when FlagChecksumPresent is set.
	Checksum uint32
}

// Sequence is a kind-1 section of an OP_MSG: documents under an identifier.
type Sequence struct {
	Identifier string
	Documents  []bson.Raw
}

// Query is the payload of a legacy OP_QUERY message.
type Query struct {
	Flags              int32
	FullCollectionName string // "db.collection", for commands "db.$cmd"
	NumberToSkip       int32
	NumberToReturn     int32
	Query              bson.Raw
	// ReturnFieldsSelector is nil when the message has none.
	ReturnFieldsSelector bson.Raw
}

// MoreToCome reports whether the moreToCome flag is set.
func (m *Msg) MoreToCome() bool { return m.FlagBits&FlagMoreToCome != 0 }

// ExhaustAllowed reports whether the exhaustAllowed flag is set.
func (m *Msg) ExhaustAllowed() bool { return m.FlagBits&FlagExhaustAllowed != 0 }

// Body decodes the command: the body section as a bson.D, with every
// document sequence appended as a bson.A of bson.D under its identifier.
// An identifier that is also a field of the body is an error.
func (m *Msg) Body() (bson.D, error) {
	return m.BodyWith(&bsonkit.Decoder{})
}

// BodyWith is Body decoding with dec, whose scratch space and field-name
// cache a connection reuses from one message to the next.
func (m *Msg) BodyWith(dec *bsonkit.Decoder) (bson.D, error) {
	body, err := dec.DecodeSpare(m.Document, len(m.Sequences))
	if err != nil {
		return nil, fmt.Errorf("%w: OP_MSG body: %w", ErrMalformed, err)
	}
	for _, s := range m.Sequences {
		for _, e := range body {
			if e.Key == s.Identifier {
				return nil, fmt.Errorf("%w: OP_MSG document sequence %q duplicates a field of the body", ErrMalformed, s.Identifier)
			}
		}
		arr := make(bson.A, 0, len(s.Documents))
		for _, raw := range s.Documents {
			d, err := dec.Decode(raw)
			if err != nil {
				return nil, fmt.Errorf("%w: OP_MSG document sequence %q: %w", ErrMalformed, s.Identifier, err)
			}
			arr = append(arr, d)
		}
		body = append(body, bson.E{Key: s.Identifier, Value: arr})
	}
	return body, nil
}

// Body decodes the command the message carries: for OP_MSG, Msg.Body; for
// OP_QUERY, the query document, unwrapped from the legacy {$query: ...}
// form when a driver sent it that way.
func (m *Message) Body() (bson.D, error) {
	switch {
	case m.Msg != nil:
		return m.Msg.Body()
	case m.Query != nil:
		var q bson.D
		if err := bson.Unmarshal(m.Query.Query, &q); err != nil {
			return nil, fmt.Errorf("%w: OP_QUERY query: %w", ErrMalformed, err)
		}
		if len(q) > 0 && q[0].Key == "$query" {
			if inner, ok := q[0].Value.(bson.D); ok {
				return inner, nil
			}
		}
		return q, nil
	}
	return nil, fmt.Errorf("%w: message has no payload", ErrMalformed)
}

// OpCodeError reports a well-framed message whose opcode this package does
// not decode. It wraps ErrCompressed for OP_COMPRESSED and
// ErrUnsupportedOpCode otherwise; the message has been consumed.
type OpCodeError struct {
	Header Header
}

// Error implements error.
func (e *OpCodeError) Error() string {
	if e.Header.OpCode == OpCompressed {
		return ErrCompressed.Error()
	}
	return fmt.Sprintf("%v %d", ErrUnsupportedOpCode, e.Header.OpCode)
}

// Unwrap returns ErrCompressed or ErrUnsupportedOpCode.
func (e *OpCodeError) Unwrap() error {
	if e.Header.OpCode == OpCompressed {
		return ErrCompressed
	}
	return ErrUnsupportedOpCode
}

// directAllocLimit is the largest message body read into a buffer allocated
// up front; larger declared sizes grow the buffer as bytes actually arrive,
// so a lying length prefix cannot force a large allocation.
const directAllocLimit = 1 << 20

// ReadMessage reads one message from r. maxSize bounds the declared message
// length (DefaultMaxMessageSize when maxSize <= 0). It returns io.EOF when r
// ends cleanly before a message starts and io.ErrUnexpectedEOF when it ends
// inside one.
func ReadMessage(r io.Reader, maxSize int) (*Message, error) {
	return readMessage(r, maxSize, nil)
}

// Reader reads messages like ReadMessage, with one payload buffer reused
// from message to message: a message Next returns, and every document in
// it, is valid only until the next call. Decode what must outlive it (as
// Msg.BodyWith does: its result shares no memory with the message).
type Reader struct {
	r       io.Reader
	maxSize int
	buf     []byte
}

// NewReader returns a Reader of r; maxSize as for ReadMessage.
func NewReader(r io.Reader, maxSize int) *Reader {
	return &Reader{r: r, maxSize: maxSize}
}

// Next reads the next message; its errors are ReadMessage's.
func (rd *Reader) Next() (*Message, error) {
	return readMessage(rd.r, rd.maxSize, &rd.buf)
}

// readMessage reads one message; when buf is not nil, payloads up to
// directAllocLimit are read into *buf (grown as needed).
func readMessage(r io.Reader, maxSize int, buf *[]byte) (*Message, error) {
	if maxSize <= 0 {
		maxSize = DefaultMaxMessageSize
	}
	var hdr [HeaderSize]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	h := Header{
		MessageLength: int32(binary.LittleEndian.Uint32(hdr[0:])),
		RequestID:     int32(binary.LittleEndian.Uint32(hdr[4:])),
		ResponseTo:    int32(binary.LittleEndian.Uint32(hdr[8:])),
		OpCode:        int32(binary.LittleEndian.Uint32(hdr[12:])),
	}
	if h.MessageLength < HeaderSize {
		return nil, fmt.Errorf("%w: message length %d is shorter than the %d-byte header", ErrFraming, h.MessageLength, HeaderSize)
	}
	if int64(h.MessageLength) > int64(maxSize) {
		return nil, fmt.Errorf("%w: %w: message length %d exceeds the limit of %d bytes", ErrFraming, ErrTooLarge, h.MessageLength, maxSize)
	}
	n := int(h.MessageLength) - HeaderSize
	payload, err := readPayload(r, n, buf)
	if err != nil {
		return nil, err
	}
	m := &Message{Header: h}
	switch h.OpCode {
	case OpMsg:
		m.Msg, err = parseMsg(hdr[:], payload)
	case OpQuery:
		m.Query, err = parseQuery(payload)
	default:
		return nil, &OpCodeError{Header: h}
	}
	var de *DepthError
	if errors.As(err, &de) {
		de.Header = h
		if h.OpCode == OpMsg {
			de.FlagBits = binary.LittleEndian.Uint32(payload)
		}
		return nil, de
	}
	if err != nil {
		return nil, err
	}
	return m, nil
}

func readPayload(r io.Reader, n int, reuse *[]byte) ([]byte, error) {
	if n <= directAllocLimit {
		var buf []byte
		if reuse != nil {
			if cap(*reuse) < n {
				*reuse = make([]byte, max(n, 1024))
			}
			buf = (*reuse)[:n]
		} else {
			buf = make([]byte, n)
		}
		if _, err := io.ReadFull(r, buf); err != nil {
			return nil, unexpected(err)
		}
		return buf, nil
	}
	var b bytes.Buffer
	b.Grow(directAllocLimit)
	got, err := b.ReadFrom(io.LimitReader(r, int64(n)))
	if err != nil {
		return nil, unexpected(err)
	}
	if got != int64(n) {
		return nil, io.ErrUnexpectedEOF
	}
	return b.Bytes(), nil
}

func unexpected(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

func malformed(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrMalformed}, args...)...)
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func parseMsg(hdr, p []byte) (*Msg, error) {
	if len(p) < 4 {
		return nil, malformed("OP_MSG too short for its flagBits")
	}
	m := &Msg{FlagBits: binary.LittleEndian.Uint32(p)}
	if unknown := m.FlagBits & requiredFlagMask &^ (FlagChecksumPresent | FlagMoreToCome); unknown != 0 {
		return nil, malformed("OP_MSG has unknown required flag bits %#x", unknown)
	}
	sections := p[4:]
	if m.FlagBits&FlagChecksumPresent != 0 {
		if len(sections) < 4 {
			return nil, malformed("OP_MSG checksum flag set but no room for the checksum")
		}
		cut := len(sections) - 4
		m.Checksum = binary.LittleEndian.Uint32(sections[cut:])
		crc := crc32.Update(0, castagnoli, hdr)
		crc = crc32.Update(crc, castagnoli, p[:len(p)-4])
		if crc != m.Checksum {
			return nil, malformed("OP_MSG checksum mismatch (got %#08x, computed %#08x)", m.Checksum, crc)
		}
		sections = sections[:cut]
	}
	haveBody := false
	for len(sections) > 0 {
		kind := sections[0]
		sections = sections[1:]
		switch kind {
		case 0:
			if haveBody {
				return nil, malformed("OP_MSG has more than one body (kind 0) section")
			}
			doc, rest, err := readDoc(sections, "OP_MSG body section")
			if err != nil {
				return nil, err
			}
			m.Document, sections, haveBody = doc, rest, true
		case 1:
			seq, rest, err := readSequence(sections)
			if err != nil {
				return nil, err
			}
			m.Sequences = append(m.Sequences, seq)
			sections = rest
		default:
			return nil, malformed("OP_MSG section kind %d is unknown", kind)
		}
	}
	if !haveBody {
		return nil, malformed("OP_MSG has no body (kind 0) section")
	}
	return m, nil
}

func readSequence(p []byte) (Sequence, []byte, error) {
	if len(p) < 4 {
		return Sequence{}, nil, malformed("OP_MSG document sequence too short for its size")
	}
	size := int64(int32(binary.LittleEndian.Uint32(p)))
	if size < 5 || size > int64(len(p)) {
		return Sequence{}, nil, malformed("OP_MSG document sequence size %d is out of range (1..%d bytes remain)", size, len(p))
	}
	body, rest := p[4:size], p[size:]
	id, body, err := readCString(body, "OP_MSG document sequence identifier")
	if err != nil {
		return Sequence{}, nil, err
	}
	seq := Sequence{Identifier: id}
	for len(body) > 0 {
		var doc bson.Raw
		doc, body, err = readDoc(body, "OP_MSG document sequence "+fmt.Sprintf("%q", id))
		if err != nil {
			return Sequence{}, nil, err
		}
		seq.Documents = append(seq.Documents, doc)
	}
	return seq, rest, nil
}

func parseQuery(p []byte) (*Query, error) {
	if len(p) < 4 {
		return nil, malformed("OP_QUERY too short for its flags")
	}
	q := &Query{Flags: int32(binary.LittleEndian.Uint32(p))}
	name, rest, err := readCString(p[4:], "OP_QUERY fullCollectionName")
	if err != nil {
		return nil, err
	}
	q.FullCollectionName = name
	if len(rest) < 8 {
		return nil, malformed("OP_QUERY too short for numberToSkip and numberToReturn")
	}
	q.NumberToSkip = int32(binary.LittleEndian.Uint32(rest))
	q.NumberToReturn = int32(binary.LittleEndian.Uint32(rest[4:]))
	q.Query, rest, err = readDoc(rest[8:], "OP_QUERY query")
	if err != nil {
		return nil, err
	}
	if len(rest) > 0 {
		q.ReturnFieldsSelector, rest, err = readDoc(rest, "OP_QUERY returnFieldsSelector")
		if err != nil {
			return nil, err
		}
		if len(rest) > 0 {
			return nil, malformed("OP_QUERY has %d trailing bytes", len(rest))
		}
	}
	return q, nil
}

// readCString reads a NUL-terminated string.
func readCString(p []byte, what string) (string, []byte, error) {
	i := bytes.IndexByte(p, 0)
	if i < 0 {
		return "", nil, malformed("%s is not NUL-terminated", what)
	}
	return string(p[:i]), p[i+1:], nil
}

// readDoc reads one BSON document and validates it: first its framing and
// nesting depth (bsonkit.CheckDepth, which does not recurse), then its
// values.
func readDoc(p []byte, what string) (bson.Raw, []byte, error) {
	if len(p) < 4 {
		return nil, nil, malformed("%s: too short for a document length", what)
	}
	size := int64(int32(binary.LittleEndian.Uint32(p)))
	if size < 5 || size > int64(len(p)) {
		return nil, nil, malformed("%s: document length %d is out of range (5..%d)", what, size, len(p))
	}
	doc := bson.Raw(p[:size:size])
	var de *bsonkit.DepthError
	if err := bsonkit.CheckDepth(doc, bsonkit.MaxWireDepth); errors.As(err, &de) {
		return nil, nil, &DepthError{Where: what, Limit: de.Limit}
	} else if err != nil {
		return nil, nil, malformed("%s: invalid BSON: %v", what, err)
	}
	if err := doc.Validate(); err != nil {
		return nil, nil, malformed("%s: invalid BSON: %v", what, err)
	}
	return doc, p[size:], nil
}

// checkDoc verifies that b is a plausibly framed BSON document before it is
// written: its length prefix matches and it ends with NUL.
func checkDoc(b []byte) error {
	if len(b) < 5 || int64(int32(binary.LittleEndian.Uint32(b))) != int64(len(b)) || b[len(b)-1] != 0 {
		return fmt.Errorf("wire: reply document is not a framed BSON document (%d bytes)", len(b))
	}
	return nil
}

// msgPrefix is the size of an OP_MSG frame before its body document: the
// header, flagBits and the body section's kind byte.
const msgPrefix = HeaderSize + 4 + 1

// StartMsg appends room for an OP_MSG prefix to dst; the body document is
// appended after it and FinishMsg completes the frame. Together they build
// a whole frame in a buffer the caller reuses, for one write per reply.
func StartMsg(dst []byte) []byte {
	return append(dst, make([]byte, msgPrefix)...)
}

// FinishMsg fills the prefix of frame, an OP_MSG with a single body section
// built with StartMsg. flags must not contain FlagChecksumPresent (no
// checksum is written).
func FinishMsg(frame []byte, requestID, responseTo int32, flags uint32) error {
	if flags&FlagChecksumPresent != 0 {
		return errors.New("wire: OP_MSG checksums are not written; clear FlagChecksumPresent")
	}
	if len(frame) < msgPrefix {
		return errors.New("wire: OP_MSG frame shorter than its prefix")
	}
	if err := checkDoc(frame[msgPrefix:]); err != nil {
		return err
	}
	if len(frame) > 1<<31-1 {
		return errors.New("wire: message too large")
	}
	putHeader(frame, len(frame), requestID, responseTo, OpMsg)
	binary.LittleEndian.PutUint32(frame[16:], flags)
	frame[20] = 0
	return nil
}

// WriteMsg writes an OP_MSG with a single body section. flags must not
// contain FlagChecksumPresent (no checksum is written).
func WriteMsg(w io.Writer, requestID, responseTo int32, flags uint32, body []byte) error {
	buf := append(StartMsg(make([]byte, 0, msgPrefix+len(body))), body...)
	if err := FinishMsg(buf, requestID, responseTo, flags); err != nil {
		return err
	}
	_, err := w.Write(buf)
	return err
}

// WriteReply writes an OP_REPLY carrying one document, as MongoDB answers
// an OP_QUERY command: responseFlags AwaitCapable, cursorID 0,
// startingFrom 0, numberReturned 1.
func WriteReply(w io.Writer, requestID, responseTo int32, doc []byte) error {
	if err := checkDoc(doc); err != nil {
		return err
	}
	size := HeaderSize + 4 + 8 + 4 + 4 + len(doc)
	if size > 1<<31-1 {
		return errors.New("wire: message too large")
	}
	buf := make([]byte, size)
	putHeader(buf, size, requestID, responseTo, OpReply)
	binary.LittleEndian.PutUint32(buf[16:], uint32(AwaitCapable))
	// cursorID (8 bytes) and startingFrom (4 bytes) stay zero.
	binary.LittleEndian.PutUint32(buf[32:], 1)
	copy(buf[36:], doc)
	_, err := w.Write(buf)
	return err
}

func putHeader(buf []byte, size int, requestID, responseTo, op int32) {
	binary.LittleEndian.PutUint32(buf[0:], uint32(size))
	binary.LittleEndian.PutUint32(buf[4:], uint32(requestID))
	binary.LittleEndian.PutUint32(buf[8:], uint32(responseTo))
	binary.LittleEndian.PutUint32(buf[12:], uint32(op))
}
