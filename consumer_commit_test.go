package outbox

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	itel "github.com/event-outbox/outbox/internal/telemetry"
)

// A partition lost while its worker handles a record must not get that
// record's offset committed: another member may own the partition already
// (Kafka does not check ownership, only the generation, which is still
// valid here). The record is redelivered after the rejoin and the inbox
// skips it. Under KIP-848 the heartbeat is answered FENCED_MEMBER_EPOCH
// while the broker still counts the member at its epoch.
func TestConsumerLostPartitionIsNotCommitted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.cluster(t, "fail one heartbeat while the member stays valid")
	cfg := consumerConfig(b, "lost")
	o := newOtel(t, &cfg)
	c := b.client(t, cfg)
	blocked, release := make(chan struct{}, 1), make(chan struct{})
	var releaseOnce sync.Once
	unblock := func() { releaseOnce.Do(func() { close(release) }) }
	MustHandle(c, func(ctx context.Context, e orderPlaced, m Metadata) error {
		if e.Run == b.run && e.Seq == 1 {
			select {
			case blocked <- struct{}{}:
			default:
			}
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	})
	start(t, c)
	t.Cleanup(unblock) // before Run stops (cleanups run last first)

	b.produceOrders(t, 0, 1)
	eventually(t, "the first record committed", func() bool {
		return committed(t, b, c.cfg.ConsumerGroup, ordersTopic, 0) == 1
	})
	b.produceOrders(t, 1, 1)
	select {
	case <-blocked:
	case <-time.After(30 * time.Second):
		t.Fatal("the handler did not block")
	}
	// The group's next heartbeat fails: kgo ends the session and calls
	// OnPartitionsLost while the worker is in the handler. The member and
	// its generation stay valid at the broker, so a commit would succeed.
	cl := b.cluster(t, "fail one heartbeat while the member stays valid")
	if b.protocol == GroupConsumer {
		cl.ControlKey(int16(kmsg.ConsumerGroupHeartbeat), func(r kmsg.Request) (kmsg.Response, error, bool) {
			req := r.(*kmsg.ConsumerGroupHeartbeatRequest)
			if req.Group != c.cfg.ConsumerGroup || req.MemberEpoch <= 0 {
				return nil, nil, false
			}
			resp := req.ResponseKind().(*kmsg.ConsumerGroupHeartbeatResponse)
			resp.ErrorCode = kerr.FencedMemberEpoch.Code
			return resp, nil, true
		})
	} else {
		cl.ControlKey(int16(kmsg.Heartbeat), func(r kmsg.Request) (kmsg.Response, error, bool) {
			resp := r.(*kmsg.HeartbeatRequest).ResponseKind().(*kmsg.HeartbeatResponse)
			resp.ErrorCode = kerr.IllegalGeneration.Code
			return resp, nil, true
		})
	}
	eventually(t, "partitions lost", func() bool {
		return sumOf(o.collect(t)["outbox.rebalances"], itel.AttrRole.String("consumer"), itel.AttrChange.String("lost")) >= 1
	})
	unblock()
	eventually(t, "the record redelivered after the rejoin and skipped as a duplicate", func() bool {
		return sumOf(o.collect(t)["outbox.events.skipped"], itel.AttrTopic.String(ordersTopic), itel.AttrReason.String("duplicate")) == 1
	})
	eventually(t, "committed past it by the new session", func() bool {
		return committed(t, b, c.cfg.ConsumerGroup, ordersTopic, 0) == 2
	})
}
