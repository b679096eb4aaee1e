package kafkax

import (
	"context"
	"encoding/binary"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// renewals records a tap's renewals.
type renewals struct {
	mu  sync.Mutex
	at  []time.Time
	sig chan struct{}
}

func newRenewals() *renewals { return &renewals{sig: make(chan struct{}, 1)} }

func (r *renewals) renewed(sentAt time.Time, _ time.Duration) {
	r.mu.Lock()
	r.at = append(r.at, sentAt)
	r.mu.Unlock()
	select {
	case r.sig <- struct{}{}:
	default:
	}
}

// after counts the renewals of heartbeats sent after t.
func (r *renewals) after(t time.Time) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, at := range r.at {
		if at.After(t) {
			n++
		}
	}
	return n
}

// waitAfter waits until n renewals of heartbeats sent after t were seen.
func (r *renewals) waitAfter(t *testing.T, since time.Time, n int) {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for r.after(since) < n {
		select {
		case <-r.sig:
		case <-deadline:
			t.Fatalf("%d renewals after %v, want %d", r.after(since), since, n)
		}
	}
}

// A KIP-848 member's heartbeats answered 0 renew; heartbeats answered with
// an error (NOT_COORDINATOR, UNKNOWN_MEMBER_ID, FENCED_MEMBER_EPOCH) and the
// leave do not, and renewals resume once the coordinator answers 0 again.
func TestHeartbeatTapRenewsOnlyOnAnswersZero(t *testing.T) {
	t.Parallel()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, "t"), kfake.BrokerConfigs(map[string]string{
		"group.consumer.heartbeat.interval.ms": "100",
		"group.consumer.session.timeout.ms":    "3000",
	}))
	require.NoError(t, err)
	t.Cleanup(c.Close)

	r := newRenewals()
	tap := &HeartbeatTap{Group: "g", Dial: (&net.Dialer{Timeout: 5 * time.Second}).DialContext, Renewed: r.renewed}
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumerGroup("g"), kgo.ConsumeTopics("t"),
		kgo.ServerSideBalancer(), kgo.Dialer(tap.DialContext))
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Go(func() {
		for ctx.Err() == nil {
			cl.PollFetches(ctx)
		}
	})

	start := time.Now()
	r.waitAfter(t, start, 3)

	// Heartbeats are sequential: when the coordinator meets the sixth
	// refused one, the tap has read the answers of the five before it.
	for _, code := range []int16{kerr.NotCoordinator.Code, kerr.UnknownMemberID.Code, kerr.FencedMemberEpoch.Code} {
		installed := time.Now()
		var refused atomic.Int32
		renewedWhileRefused := make(chan int, 1)
		c.ControlKey(int16(kmsg.ConsumerGroupHeartbeat), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
			c.KeepControl()
			switch n := refused.Add(1); {
			case n == 6:
				renewedWhileRefused <- r.after(installed)
			case n > 6:
				return nil, nil, false
			}
			resp := kreq.ResponseKind().(*kmsg.ConsumerGroupHeartbeatResponse)
			resp.ErrorCode = code
			return resp, nil, true
		})
		select {
		case n := <-renewedWhileRefused:
			require.Zero(t, n, "code %d: a refused heartbeat renewed", code)
		case <-time.After(20 * time.Second):
			t.Fatalf("code %d: %d heartbeats refused", code, refused.Load())
		}
		r.waitAfter(t, time.Now(), 2) // answered 0 again: renewed again
	}

	// A leave answered 0 renews nothing.
	cancel()
	wg.Wait()
	left := time.Now()
	lctx, lcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer lcancel()
	require.NoError(t, cl.LeaveGroupContext(lctx))
	require.Zero(t, r.after(left), "the leave renewed")
}

// The tap's renewals, checked heartbeat by heartbeat: the refusal counter
// of the test above only bounds them. Here every answer is hand-made and
// fed to a connection in pieces of every size.
func TestHeartbeatTapFollowsSplitFrames(t *testing.T) {
	t.Parallel()
	hb := func(corr int32, epoch int32) []byte {
		req := kmsg.NewPtrConsumerGroupHeartbeatRequest()
		req.Version = 1
		req.Group = "g"
		req.MemberID = "m"
		req.MemberEpoch = epoch
		body := req.AppendTo(nil)
		hdr := binary.BigEndian.AppendUint16(nil, uint16(kmsg.ConsumerGroupHeartbeat))
		hdr = binary.BigEndian.AppendUint16(hdr, 1)
		hdr = binary.BigEndian.AppendUint32(hdr, uint32(corr))
		hdr = binary.BigEndian.AppendUint16(hdr, 3) // client id
		hdr = append(hdr, "cli"...)
		hdr = append(hdr, 0) // no tags
		frame := binary.BigEndian.AppendUint32(nil, uint32(len(hdr)+len(body)))
		return append(append(frame, hdr...), body...)
	}
	other := func(corr int32) []byte { // a Metadata request
		hdr := binary.BigEndian.AppendUint16(nil, uint16(kmsg.Metadata))
		hdr = binary.BigEndian.AppendUint16(hdr, 12)
		hdr = binary.BigEndian.AppendUint32(hdr, uint32(corr))
		hdr = append(hdr, 0xff, 0xff, 0, 1, 0, 0, 0) // null client id, tags, some body
		return append(binary.BigEndian.AppendUint32(nil, uint32(len(hdr))), hdr...)
	}
	answer := func(corr int32, code int16, epoch int32) []byte {
		resp := kmsg.NewPtrConsumerGroupHeartbeatResponse()
		resp.Version = 1
		resp.ErrorCode = code
		resp.MemberEpoch = epoch
		resp.HeartbeatIntervalMillis = 100
		body := resp.AppendTo(nil)
		hdr := append(binary.BigEndian.AppendUint32(nil, uint32(corr)), 0)
		frame := binary.BigEndian.AppendUint32(nil, uint32(len(hdr)+len(body)))
		return append(append(frame, hdr...), body...)
	}
	plain := func(corr int32, n int) []byte {
		b := binary.BigEndian.AppendUint32(nil, uint32(4+n))
		b = binary.BigEndian.AppendUint32(b, uint32(corr))
		return append(b, make([]byte, n)...)
	}
	var writes, reads []byte
	writes = append(writes, other(1)...)
	writes = append(writes, hb(2, 5)...)  // answered 0: renews
	writes = append(writes, hb(3, 5)...)  // answered FENCED_MEMBER_EPOCH
	writes = append(writes, hb(4, -1)...) // a leave answered 0
	writes = append(writes, hb(5, 0)...)  // a join answered 0 with epoch 6: renews
	reads = append(reads, plain(1, 300)...)
	reads = append(reads, answer(2, 0, 5)...)
	reads = append(reads, answer(3, kerr.FencedMemberEpoch.Code, -1)...)
	reads = append(reads, answer(4, 0, -1)...)
	reads = append(reads, answer(5, 0, 6)...)

	for _, chunk := range []int{1, 2, 3, 7, 64, 1 << 20} {
		var n []time.Time
		tick := time.Unix(0, 0)
		tap := &HeartbeatTap{Group: "g", Renewed: func(at time.Time, iv time.Duration) {
			require.Equal(t, 100*time.Millisecond, iv)
			n = append(n, at)
		}, Now: func() time.Time { tick = tick.Add(time.Second); return tick }}
		c := &tapConn{Conn: nopConn{}, tap: tap, pending: map[int32]pendingBeat{}}
		for b := writes; len(b) > 0; {
			k := min(chunk, len(b))
			_, _ = c.Write(b[:k])
			b = b[k:]
		}
		src := &chunkConn{data: reads, chunk: chunk}
		c.Conn = src
		buf := make([]byte, 1<<20)
		for len(src.data) > 0 {
			_, _ = c.Read(buf)
		}
		require.False(t, c.broken, "chunk %d", chunk)
		require.Len(t, n, 2, "chunk %d: the heartbeats answered 0 with an epoch renew", chunk)
		require.Empty(t, c.pending)
	}

	// A stream that is no Kafka stream stops the tap.
	c := &tapConn{Conn: nopConn{}, tap: &HeartbeatTap{Group: "g", Renewed: func(time.Time, time.Duration) { t.Fatal("renewed") }}, pending: map[int32]pendingBeat{}}
	_, _ = c.Write([]byte{0x80, 0, 0, 0, 1})
	require.True(t, c.broken)
}

// nopConn accepts every write.
type nopConn struct{ net.Conn }

func (nopConn) Write(p []byte) (int, error) { return len(p), nil }

// chunkConn serves data in reads of at most chunk bytes.
type chunkConn struct {
	net.Conn
	data  []byte
	chunk int
}

func (c *chunkConn) Read(p []byte) (int, error) {
	n := copy(p[:min(len(p), c.chunk)], c.data)
	c.data = c.data[n:]
	return n, nil
}

// The session timeout the lease uses is the shortest the brokers and the
// group report.
func TestConsumerGroupSessionTimeout(t *testing.T) {
	t.Parallel()
	c, err := kfake.NewCluster(kfake.NumBrokers(2), kfake.BrokerConfigs(map[string]string{
		"group.consumer.session.timeout.ms": "7000",
	}))
	require.NoError(t, err)
	t.Cleanup(c.Close)
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	require.NoError(t, err)
	t.Cleanup(cl.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	d, err := ConsumerGroupSessionTimeout(ctx, cl, "g")
	require.NoError(t, err)
	require.Equal(t, 7*time.Second, d)

	// The group's own, shorter setting wins.
	req := kmsg.NewPtrIncrementalAlterConfigsRequest()
	res := kmsg.NewIncrementalAlterConfigsRequestResource()
	res.ResourceType = kmsg.ConfigResourceTypeGroupConfig
	res.ResourceName = "g"
	cfg := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
	cfg.Name = GroupConsumerSessionTimeout
	v := "4500"
	cfg.Value = &v
	res.Configs = append(res.Configs, cfg)
	req.Resources = append(req.Resources, res)
	resp, err := req.RequestWith(ctx, cl)
	require.NoError(t, err)
	require.Zero(t, resp.Resources[0].ErrorCode)
	d, err = ConsumerGroupSessionTimeout(ctx, cl, "g")
	require.NoError(t, err)
	require.Equal(t, 4500*time.Millisecond, d)
}

func TestEffectiveDialer(t *testing.T) {
	t.Parallel()
	called := false
	mine := func(context.Context, string, string) (net.Conn, error) { called = true; return nil, net.ErrClosed }
	d, err := EffectiveDialer(kgo.Dialer(mine))
	require.NoError(t, err)
	_, _ = d(context.Background(), "tcp", "x:1")
	require.True(t, called, "the application's dialer")
	d, err = EffectiveDialer()
	require.NoError(t, err)
	require.NotNil(t, d, "kgo's default")
}
