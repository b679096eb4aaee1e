package outbox

import (
	"sync/atomic"
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// The publisher's lease is renewed only by group responses with error code 0.
// While the coordinator answers every heartbeat of the publisher group with
// REBALANCE_IN_PROGRESS (a member that keeps rejoining: its session is not
// confirmed) the lease must lapse, which it would never do if every completed
// round trip renewed it. Once heartbeats succeed again the lease is valid
// again.
func TestPublisherLeaseRenewedOnlyBySuccessfulHeartbeats(t *testing.T) {
	t.Parallel()
	forEachGroupProtocol(t, func(t *testing.T) {
		t.Parallel()
		testLeaseRenewedOnlyBySuccessfulHeartbeats(t)
	})
}

// Under the classic protocol heartbeats are refused with
// REBALANCE_IN_PROGRESS; under KIP-848 with NOT_COORDINATOR, which kgo
// retries in place without ending the session (the codes that end it,
// UNKNOWN_MEMBER_ID and FENCED_MEMBER_EPOCH, revoke the lease through
// OnPartitionsLost anyway).
func testLeaseRenewedOnlyBySuccessfulHeartbeats(t *testing.T) {
	b := setup(t)
	b.cluster(t, "fail the publisher group's heartbeats on demand")
	cfg := pubConfig(b)
	c := b.client(t, cfg)
	runPub(t, c, publisherOptions{})
	eventually(t, "owning and leased", func() bool {
		st := c.publisherStatus()
		return st.LeaseValid && len(st.Owned) == 3
	})

	var code atomic.Int32 // 0: let heartbeats through
	cl := b.cluster(t, "fail the publisher group's heartbeats on demand")
	if b.protocol == GroupConsumer {
		cl.ControlKey(int16(kmsg.ConsumerGroupHeartbeat), func(req kmsg.Request) (kmsg.Response, error, bool) {
			cl.KeepControl()
			hb := req.(*kmsg.ConsumerGroupHeartbeatRequest)
			if hb.Group != c.cfg.PublisherGroup || code.Load() == 0 {
				return nil, nil, false
			}
			resp := hb.ResponseKind().(*kmsg.ConsumerGroupHeartbeatResponse)
			resp.ErrorCode = int16(code.Load())
			return resp, nil, true
		})
		code.Store(int32(kerr.NotCoordinator.Code))
	} else {
		cl.ControlKey(int16(kmsg.Heartbeat), func(req kmsg.Request) (kmsg.Response, error, bool) {
			cl.KeepControl()
			hb := req.(*kmsg.HeartbeatRequest)
			if hb.Group != c.cfg.PublisherGroup || code.Load() == 0 {
				return nil, nil, false
			}
			resp := hb.ResponseKind().(*kmsg.HeartbeatResponse)
			resp.ErrorCode = int16(code.Load())
			return resp, nil, true
		})
		code.Store(int32(kerr.RebalanceInProgress.Code))
	}
	eventually(t, "the lease lapses while heartbeats are refused", func() bool { return !c.publisherStatus().LeaseValid })
	code.Store(0)
	eventually(t, "the lease is renewed once heartbeats succeed", func() bool { return c.publisherStatus().LeaseValid })
}
