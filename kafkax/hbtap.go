package kafkax

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/event-outbox/outbox/internal/kwire"
)

// EffectiveDialer returns the dial function of a kgo client built from
// opts: the one of kgo.Dialer, kgo's TLS dialer for kgo.DialTLSConfig, or
// kgo's plain default. It builds such a client to read it (without opening
// a connection) and closes it at once, so hooks among opts see one client
// created and closed. Wrap the result (HeartbeatTap) to observe a client's
// connections whatever the application configured.
func EffectiveDialer(opts ...kgo.Opt) (func(ctx context.Context, network, addr string) (net.Conn, error), error) {
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	dial, ok := cl.OptValue(kgo.Dialer).(func(context.Context, string, string) (net.Conn, error))
	if !ok || dial == nil {
		return nil, errors.New("kafkax: the client has no dial function")
	}
	return dial, nil
}

// HeartbeatTap confirms a member's KIP-848 consumer-group session from the
// group client's own ConsumerGroupHeartbeat exchanges: it wraps the
// client's connections (pass DialContext to kgo.Dialer), reads the Kafka
// frames that pass, and reports every heartbeat of its group that the
// coordinator answered with error code 0.
//
// Under KIP-848 a probe cannot send heartbeats of its own, as SessionProbe
// does for classic groups: a ConsumerGroupHeartbeat is the member's
// reconciliation as well as its keep-alive, its answer may carry a new
// epoch and assignment that the group client would never see, and the
// coordinator would then fence the client's next heartbeat. kgo's hooks see
// that a round trip completed, never its error code, so the tap reads the
// answers on the wire.
//
// A heartbeat answered 0 proves that the coordinator knew the member, in
// the epoch the request carried or the one the answer gives, at some time
// after the request was written; the coordinator cannot then expire the
// member before sentAt + session timeout. Leaves (member epoch -1 or -2)
// answered 0 prove the opposite and renew nothing; so does every other
// error code (UNKNOWN_MEMBER_ID, FENCED_MEMBER_EPOCH, NOT_COORDINATOR...),
// a transport error or an unparseable stream (the connection's tap then
// stops reporting, which fails safe: the lease runs out).
//
// Requests are read before they are written (so an answer can never
// overtake its request's record), and sentAt is taken before the write:
// earlier than the coordinator's receipt, hence conservative.
type HeartbeatTap struct {
	// Group is the consumer group whose heartbeats count. Required.
	Group string
	// Dial opens the connections the tap wraps: the dial function the
	// group client would use without the tap (kgo's default, a TLS dialer,
	// or the application's own). Required.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// Renewed receives the send time of each heartbeat answered 0, and the
	// heartbeat interval the coordinator asked for. Required.
	Renewed func(sentAt time.Time, interval time.Duration)
	// Now is the clock. Defaults to time.Now.
	Now func() time.Time
}

// DialContext dials with Dial and wraps the connection. Pass it to
// kgo.Dialer.
func (t *HeartbeatTap) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := t.Dial(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &tapConn{Conn: c, tap: t, pending: map[int32]pendingBeat{}}, nil
}

func (t *HeartbeatTap) now() time.Time {
	if t.Now != nil {
		return t.Now()
	}
	return time.Now()
}

// maxPending bounds the unanswered heartbeats of a tapped connection: more
// stop its tap, as a heartbeat frame larger than kwire.MaxKeptFrame does.
const maxPending = 64

// pendingBeat is a heartbeat written and not answered yet.
type pendingBeat struct {
	sentAt  time.Time
	version int16
	epoch   int32
}

// tapConn is a tapped connection. kgo writes on one goroutine and reads on
// another; mu guards the state both share.
type tapConn struct {
	net.Conn
	tap *HeartbeatTap

	reqs  kwire.Splitter // written frames (requests)
	resps kwire.Splitter // read frames (responses)

	mu      sync.Mutex
	pending map[int32]pendingBeat // by correlation id
	broken  bool                  // the stream could not be followed: report nothing more
}

func (c *tapConn) Write(p []byte) (int, error) {
	now := c.tap.now()
	c.mu.Lock()
	if !c.broken && !c.reqs.Feed(p, c.requestHead, func(body []byte) { c.request(body, now) }) {
		c.broken = true
	}
	c.mu.Unlock()
	return c.Conn.Write(p)
}

func (c *tapConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		var renewals []pendingBeat
		var intervals []time.Duration
		c.mu.Lock()
		if !c.broken && !c.resps.Feed(p[:n], c.responseHead, func(body []byte) {
			if b, iv, ok := c.response(body); ok {
				renewals = append(renewals, b)
				intervals = append(intervals, iv)
			}
		}) {
			c.broken = true
		}
		broken := c.broken
		c.mu.Unlock()
		if !broken {
			for i, b := range renewals {
				c.tap.Renewed(b.sentAt, intervals[i])
			}
		}
	}
	return n, err
}

// requestHead reports whether a request frame, given its first bytes
// (api key, version, correlation id), is kept whole: only heartbeats are.
func (c *tapConn) requestHead(head []byte) bool {
	return len(head) >= 8 && int16(binary.BigEndian.Uint16(head)) == int16(kmsg.ConsumerGroupHeartbeat)
}

// responseHead reports whether a response frame, given its first bytes
// (correlation id), answers a heartbeat.
func (c *tapConn) responseHead(head []byte) bool {
	if len(head) < 4 {
		return false
	}
	_, ok := c.pending[int32(binary.BigEndian.Uint32(head))]
	return ok
}

// request records a heartbeat request of the tap's group (c.mu held).
func (c *tapConn) request(body []byte, sentAt time.Time) {
	if len(body) < 8 {
		c.broken = true
		return
	}
	version := int16(binary.BigEndian.Uint16(body[2:]))
	corr := int32(binary.BigEndian.Uint32(body[4:]))
	rest, ok := skipRequestHeader(body[8:])
	if !ok {
		c.broken = true
		return
	}
	req := kmsg.NewPtrConsumerGroupHeartbeatRequest()
	req.Version = version
	if err := req.ReadFrom(rest); err != nil {
		c.broken = true
		return
	}
	if req.Group != c.tap.Group {
		return
	}
	if len(c.pending) >= maxPending {
		c.broken = true
		return
	}
	c.pending[corr] = pendingBeat{sentAt: sentAt, version: version, epoch: req.MemberEpoch}
}

// response decodes a heartbeat's answer (c.mu held) and returns its
// request and the interval asked for when it renews the session.
func (c *tapConn) response(body []byte) (pendingBeat, time.Duration, bool) {
	if len(body) < 4 {
		c.broken = true
		return pendingBeat{}, 0, false
	}
	corr := int32(binary.BigEndian.Uint32(body))
	b := c.pending[corr]
	delete(c.pending, corr)
	rest, ok := kwire.SkipTags(body[4:]) // response header v1: every version is flexible
	if !ok {
		c.broken = true
		return pendingBeat{}, 0, false
	}
	resp := kmsg.NewPtrConsumerGroupHeartbeatResponse()
	resp.Version = b.version
	if err := resp.ReadFrom(rest); err != nil {
		c.broken = true
		return pendingBeat{}, 0, false
	}
	if resp.ErrorCode != 0 || b.epoch < 0 || resp.MemberEpoch < 0 {
		return pendingBeat{}, 0, false
	}
	return b, time.Duration(resp.HeartbeatIntervalMillis) * time.Millisecond, true
}

// skipRequestHeader skips the rest of a request header v2 after the api
// key, version and correlation id: the client id (nullable, int16 length)
// and the tagged fields.
func skipRequestHeader(b []byte) ([]byte, bool) {
	if len(b) < 2 {
		return nil, false
	}
	n := int(int16(binary.BigEndian.Uint16(b)))
	b = b[2:]
	if n > 0 {
		if len(b) < n {
			return nil, false
		}
		b = b[n:]
	}
	return kwire.SkipTags(b)
}
