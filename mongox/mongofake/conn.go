package mongofake

import (
	"bufio"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"runtime/debug"
	"strings"
	"sync/atomic"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/event-outbox/outbox/mongox/internal/bsonkit"
	"github.com/event-outbox/outbox/mongox/internal/wire"
)

// conn is one client connection. Its goroutine reads one message at a time
// and answers it before reading the next, as mongod does; id and appName are
// only written by that goroutine.
type conn struct {
	id      int64  // increasing, from 1
	appName string // client.application.name of the handshake, "" if none

	srv    *Server
	nc     net.Conn
	remote string
	ctx    context.Context // ends when the connection closes or the server stops
	cancel context.CancelFunc

	gotMetadata bool // the handshake's client document was seen
	// metadata is the handshake's client document, for $currentOp (which
	// reads it from other goroutines); nil until the handshake.
	metadata atomic.Pointer[bson.D]
	// op is the command the connection is running, nil between commands.
	op atomic.Pointer[runningOp]

	dec  bsonkit.Decoder // decodes commands; reused by the goroutine
	wbuf []byte          // the reply frame being built; reused by the goroutine
}

// maxKeptWriteBuffer is the largest reply buffer a connection keeps for the
// next reply; a larger one (a big batch) is left to the garbage collector.
const maxKeptWriteBuffer = 1 << 20

// newConn wraps an accepted connection.
func (s *Server) newConn(nc net.Conn) *conn {
	c := &conn{
		id:     s.nextConnID.Add(1),
		srv:    s,
		nc:     nc,
		remote: nc.RemoteAddr().String(),
	}
	c.ctx, c.cancel = context.WithCancel(s.ctx)
	return c
}

// serve reads and answers messages until the connection ends, the client
// sends something it cannot answer, or the server closes.
func (c *conn) serve() {
	s := c.srv
	log := s.logger.With("conn", c.id, "remote", c.remote)
	defer func() {
		if p := recover(); p != nil {
			log.Error("mongofake: connection goroutine panicked; closing connection",
				"panic", p, "stack", string(debug.Stack()))
		}
		c.cancel()
		_ = c.nc.Close()
		s.removeConn(c)
		s.wg.Done()
		log.Debug("mongofake: connection closed")
	}()
	log.Debug("mongofake: connection accepted")

	rd := wire.NewReader(bufio.NewReaderSize(c.nc, 64<<10), s.cfg.maxMessageSize)
	for {
		// m is valid until the next read: handle decodes what it keeps.
		m, err := rd.Next()
		var deep *wire.DepthError
		if errors.As(err, &deep) {
			if !c.refuseTooDeep(deep, log) {
				return
			}
			continue
		}
		if err != nil {
			switch {
			case errors.Is(err, io.EOF), errors.Is(err, net.ErrClosed), c.ctx.Err() != nil:
				// Client hung up, DropConnections or Close.
			case errors.Is(err, wire.ErrCompressed):
				log.Warn("mongofake: client sent OP_COMPRESSED although no compressor was negotiated; closing connection", "err", err)
			default:
				log.Warn("mongofake: cannot read message; closing connection", "err", err)
			}
			return
		}
		if !c.handle(m, log) {
			return
		}
	}
}

// handle answers one message. It returns false when the connection must be
// closed.
func (c *conn) handle(m *wire.Message, log *slog.Logger) bool {
	s := c.srv
	switch {
	case m.Msg != nil:
		body, err := m.Msg.BodyWith(&c.dec)
		if err != nil {
			log.Warn("mongofake: malformed OP_MSG; closing connection", "err", err)
			return false
		}
		reply, drop := s.dispatch(c, body, "")
		if drop {
			return false
		}
		if m.Msg.MoreToCome() {
			// w:0 / unacknowledged: the client does not read a reply.
			return true
		}
		return c.writeMsg(reply, m.Header.RequestID, log)

	case m.Query != nil:
		reply, drop := c.legacyQuery(m.Query)
		if drop {
			return false
		}
		return c.writeLegacyReply(reply, m.Header.RequestID, log)
	}
	log.Warn("mongofake: message without payload; closing connection", "opCode", m.Header.OpCode)
	return false
}

// refuseTooDeep answers a message holding a document nested deeper than
// mongod's maxBSONDepth, which the reader refused before anything decoded
// it, as mongod answers it: code 15, Overflow. The connection stays open
// (the message was consumed); it returns false when the reply cannot be
// written.
func (c *conn) refuseTooDeep(de *wire.DepthError, log *slog.Logger) bool {
	log.Warn("mongofake: refused a message nesting documents too deep", "err", de)
	reply := c.srv.errorReply(nil, errorf(15, "Overflow", de.Error()), nil)
	if de.Header.OpCode == wire.OpQuery {
		return c.writeLegacyReply(reply, de.Header.RequestID, log)
	}
	if de.FlagBits&wire.FlagMoreToCome != 0 {
		return true // the client reads no reply
	}
	return c.writeMsg(reply, de.Header.RequestID, log)
}

// writeMsg writes reply as an OP_MSG answering request responseTo.
func (c *conn) writeMsg(reply bson.D, responseTo int32, log *slog.Logger) bool {
	frame, err := c.replyFrame(reply, responseTo)
	if err != nil {
		log.Warn("mongofake: cannot encode reply; closing connection", "err", err)
		return false
	}
	_, err = c.nc.Write(frame)
	if cap(frame) <= maxKeptWriteBuffer {
		c.wbuf = frame[:0]
	}
	return err == nil
}

// writeLegacyReply writes reply as the OP_REPLY answering OP_QUERY
// request responseTo.
func (c *conn) writeLegacyReply(reply bson.D, responseTo int32, log *slog.Logger) bool {
	raw, err := bson.Marshal(reply)
	if err != nil {
		log.Warn("mongofake: cannot encode reply; closing connection", "err", err)
		return false
	}
	return wire.WriteReply(c.nc, c.srv.nextReqID.Add(1), responseTo, raw) == nil
}

// replyFrame encodes reply as an OP_MSG answering request responseTo, in
// the connection's reusable buffer: one frame, written with one call.
func (c *conn) replyFrame(reply bson.D, responseTo int32) ([]byte, error) {
	buf := wire.StartMsg(c.wbuf[:0])
	buf, ok := bsonkit.AppendDocument(buf, reply)
	if !ok {
		raw, err := bson.Marshal(reply)
		if err != nil {
			return nil, err
		}
		buf = append(buf, raw...)
	}
	if err := wire.FinishMsg(buf, c.srv.nextReqID.Add(1), responseTo, 0); err != nil {
		return nil, err
	}
	return buf, nil
}

// legacyQuery answers an OP_QUERY. Drivers use it for the first hello
// (isMaster) of a connection; any other command sent to "<db>.$cmd" goes
// through the dispatcher too, with $db taken from the namespace.
func (c *conn) legacyQuery(q *wire.Query) (bson.D, bool) {
	s := c.srv
	db, coll, _ := strings.Cut(q.FullCollectionName, ".")
	if coll != "$cmd" || db == "" {
		return s.errorReply(nil, &cmdError{
			Code:     352,
			CodeName: "UnsupportedOpQueryCommand",
			Msg: "mongofake: OP_QUERY is only supported for commands sent to <db>.$cmd, not for queries on " +
				q.FullCollectionName + "; use OP_MSG (any driver released since 2018 does)",
		}, nil), false
	}
	var body bson.D
	if err := bson.Unmarshal(q.Query, &body); err != nil {
		return s.errorReply(nil, errorf(9, "FailedToParse", "mongofake: cannot decode OP_QUERY command: "+err.Error()), nil), false
	}
	// Old drivers and mongos wrap the command: {$query: {...}, $readPreference: ...}.
	if len(body) > 0 && (body[0].Key == "$query" || body[0].Key == "query") {
		if inner, ok := body[0].Value.(bson.D); ok {
			body = inner
		}
	}
	return s.dispatch(c, body, db)
}
