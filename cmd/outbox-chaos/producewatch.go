package main

import (
	"context"
	"encoding/binary"
	"net"
	"sync"
	"sync/atomic"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/event-outbox/outbox/internal/kwire"
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
// kgo writes requests from one goroutine and reads responses from another;
// mu guards the state both share.
type watchedConn struct {
	net.Conn
	w *produceWatch

	out, in kwire.Splitter // written frames (requests), read frames (responses)

	mu      sync.Mutex
	produce map[int32]int16 // correlation id -> version, of Produce requests awaiting their response
	broken  bool            // the stream could not be followed: count nothing more
}

func (c *watchedConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	if !c.broken && !c.out.Feed(p, c.requestHead, nil) {
		c.broken = true
	}
	c.mu.Unlock()
	return c.Conn.Write(p)
}

// requestHead notes a Produce request, given its first bytes (api key,
// version, correlation id), and keeps no request whole (c.mu held).
func (c *watchedConn) requestHead(head []byte) bool {
	if len(head) >= kwire.HeadLen && int16(binary.BigEndian.Uint16(head)) == int16(kmsg.Produce) {
		c.produce[int32(binary.BigEndian.Uint32(head[4:]))] = int16(binary.BigEndian.Uint16(head[2:]))
	}
	return false
}

func (c *watchedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.mu.Lock()
		if !c.broken && !c.in.Feed(p[:n], c.responseHead, func(body []byte) {
			id := int32(binary.BigEndian.Uint32(body))
			v := c.produce[id]
			delete(c.produce, id)
			c.w.refused.Add(int64(countRefused(v, body[4:])))
		}) {
			c.broken = true
		}
		c.mu.Unlock()
	}
	return n, err
}

// responseHead reports whether a response frame, given its first bytes
// (correlation id), answers a Produce request (c.mu held).
func (c *watchedConn) responseHead(head []byte) bool {
	if len(head) < 4 {
		return false
	}
	_, ok := c.produce[int32(binary.BigEndian.Uint32(head))]
	return ok
}

// countRefused decodes a Produce response body (after the correlation id)
// of the given version and returns its partitions refused for want of
// in-sync replicas; 0 when it does not decode.
func countRefused(version int16, body []byte) int {
	resp := kmsg.NewPtrProduceResponse()
	resp.Version = version
	if resp.IsFlexible() {
		// The response header's tagged fields.
		var ok bool
		if body, ok = kwire.SkipTags(body); !ok {
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
