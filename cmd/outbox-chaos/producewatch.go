package main

import (
	"context"
	"encoding/binary"
	"net"
	"sync"
	"sync/atomic"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// produceWatch counts the produce refusals the replicas' Kafka clients
// receive: the partitions of Produce responses whose error is
// NOT_ENOUGH_REPLICAS or NOT_ENOUGH_REPLICAS_AFTER_APPEND. kgo retries
// those errors without a hook or a log line (below Debug), so the count is
// read off the wire: every Kafka connection of a replica is dialled
// through dial, which notes the correlation id and version of each Produce
// request written and decodes the response read with that id.
type produceWatch struct {
	refused atomic.Int64
}

// dial wraps a dialer so that its connections are watched.
func (w *produceWatch) dial(inner func(ctx context.Context, network, host string) (net.Conn, error)) func(ctx context.Context, network, host string) (net.Conn, error) {
	return func(ctx context.Context, network, host string) (net.Conn, error) {
		c, err := inner(ctx, network, host)
		if err != nil {
			return nil, err
		}
		return &watchedConn{Conn: c, w: w, produce: map[int32]int16{}}, nil
	}
}

// count returns the refusals counted.
func (w *produceWatch) count() int {
	if w == nil {
		return 0
	}
	return int(w.refused.Load())
}

// watchedConn is a Kafka connection whose Produce responses are decoded.
// kgo writes requests from one goroutine and reads responses from another:
// out and in are each used by one, produce is shared.
type watchedConn struct {
	net.Conn
	w *produceWatch

	mu      sync.Mutex
	produce map[int32]int16 // correlation id -> version, of Produce requests awaiting their response

	out, in   frameScanner
	inVersion int16 // the version of the Produce response being read
}

// Request header: size, api key, api version, correlation id. Response
// header: size, correlation id.
const (
	reqHeadLen  = 12
	respHeadLen = 8
)

func (c *watchedConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.out.feed(p[:n], reqHeadLen, func(head []byte) bool {
		if int16(binary.BigEndian.Uint16(head[4:])) == int16(kmsg.Produce) {
			c.mu.Lock()
			c.produce[int32(binary.BigEndian.Uint32(head[8:]))] = int16(binary.BigEndian.Uint16(head[6:]))
			c.mu.Unlock()
		}
		return false
	}, nil)
	return n, err
}

func (c *watchedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.in.feed(p[:n], respHeadLen, func(head []byte) bool {
		id := int32(binary.BigEndian.Uint32(head[4:]))
		c.mu.Lock()
		v, ok := c.produce[id]
		delete(c.produce, id)
		c.mu.Unlock()
		c.inVersion = v
		return ok
	}, func(body []byte) {
		c.w.refused.Add(int64(countRefused(c.inVersion, body)))
	})
	return n, err
}

// countRefused decodes a Produce response body (after the correlation id)
// of the given version and returns its partitions refused for want of
// in-sync replicas; 0 when it does not decode.
func countRefused(version int16, body []byte) int {
	resp := kmsg.NewPtrProduceResponse()
	resp.Version = version
	if resp.IsFlexible() {
		// The response header's tagged fields: a count, then each field's
		// tag, size and bytes.
		var ok bool
		if body, ok = skipTags(body); !ok {
			return 0
		}
	}
	if err := resp.ReadFrom(body); err != nil {
		return 0
	}
	n := 0
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			if p.ErrorCode == kerr.NotEnoughReplicas.Code || p.ErrorCode == kerr.NotEnoughReplicasAfterAppend.Code {
				n++
			}
		}
	}
	return n
}

// skipTags skips a block of tagged fields.
func skipTags(b []byte) ([]byte, bool) {
	count, n := binary.Uvarint(b)
	if n <= 0 {
		return nil, false
	}
	b = b[n:]
	for range count {
		if _, n = binary.Uvarint(b); n <= 0 {
			return nil, false
		}
		b = b[n:]
		size, n := binary.Uvarint(b)
		if n <= 0 || uint64(len(b)-n) < size {
			return nil, false
		}
		b = b[n+int(size):]
	}
	return b, true
}

// frameScanner follows the size-prefixed frames of one direction of a
// Kafka connection: it gathers each frame's head, asks whether to keep the
// rest of the frame (its body), and skips it otherwise. A frame too short
// for its head stops the scan: the stream is not Kafka's.
type frameScanner struct {
	head    []byte
	body    []byte
	rest    int  // bytes of the current frame after its head still to come
	keep    bool // the rest is gathered into body
	broken  bool
	started bool // the head is complete
}

// feed scans p. onHead gets each complete head and says whether to keep the
// frame's body; onBody gets each kept body, whole.
func (s *frameScanner) feed(p []byte, headLen int, onHead func(head []byte) bool, onBody func(body []byte)) {
	for len(p) > 0 && !s.broken {
		if !s.started {
			k := min(headLen-len(s.head), len(p))
			s.head = append(s.head, p[:k]...)
			p = p[k:]
			if len(s.head) < headLen {
				return
			}
			size := int(int32(binary.BigEndian.Uint32(s.head)))
			s.rest = size - (headLen - 4)
			if s.rest < 0 {
				s.broken = true
				return
			}
			s.started = true
			s.keep = onHead(s.head) && onBody != nil
			s.body = s.body[:0]
		}
		k := min(s.rest, len(p))
		if s.keep {
			s.body = append(s.body, p[:k]...)
		}
		p = p[k:]
		s.rest -= k
		if s.rest == 0 {
			if s.keep {
				onBody(s.body)
			}
			s.head, s.started, s.keep = s.head[:0], false, false
		}
	}
}
