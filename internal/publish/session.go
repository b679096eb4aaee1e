package publish

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/event-outbox/outbox/internal/retry"
	"github.com/event-outbox/outbox/kafkax"
)

// consumerSessionRefresh is how often the publisher reads again the
// session timeout the brokers apply to its KIP-848 group; a lowered
// setting shortens the lease within about this; consumerSessionTimeout
// bounds each read.
const (
	consumerSessionRefresh = 30 * time.Second
	consumerSessionTimeout = 10 * time.Second
)

// consumerSession renews the publisher's lease from the heartbeats of a
// KIP-848 group (Config.ConsumerProtocol), whose session timeout is the
// brokers' group.consumer.session.timeout.ms (or the group's
// consumer.session.timeout.ms), not Config.SessionTimeout.
//
// The rule: a heartbeat sent at sentAt and answered 0 keeps the lease until
// sentAt + S - FenceMargin, where S is the shortest session timeout the
// brokers report (kafkax.ConsumerGroupSessionTimeout). Until S is known no
// heartbeat renews (publishing waits); when S is read lower than before,
// the lease is revoked and the next heartbeat renews it for the new S.
type consumerSession struct {
	margin time.Duration
	lease  *Lease

	ttl    atomic.Int64 // S - margin in nanoseconds; 0 until S is known
	active atomic.Bool  // a heartbeat of the group was answered 0: the group runs KIP-848
}

// renewed is the kafkax.HeartbeatTap callback.
func (s *consumerSession) renewed(sentAt time.Time, _ time.Duration) {
	s.active.Store(true)
	s.lease.RenewFor(sentAt, time.Duration(s.ttl.Load()))
}

// set records a session timeout read from the brokers. It returns an
// error when FenceMargin leaves no lease.
func (s *consumerSession) set(session time.Duration) error {
	ttl := session - s.margin
	if ttl <= 0 {
		s.ttl.Store(0)
		s.lease.Revoke()
		return fmt.Errorf("FenceMargin %v is not shorter than the brokers' %s %v: no lease can be granted, publishing is paused", s.margin, kafkax.BrokerConsumerSessionTimeout, session)
	}
	if old := time.Duration(s.ttl.Swap(int64(ttl))); old > ttl {
		s.lease.Revoke()
	}
	return nil
}

// follow reads the brokers' session timeout at once and every
// consumerSessionRefresh, retrying failures with backoff, until ctx ends.
func (s *consumerSession) follow(ctx context.Context, cl *kgo.Client, group string, b retry.Backoff, stats *Stats, log *slog.Logger) {
	failures := 0
	for {
		rctx, cancel := context.WithTimeout(ctx, consumerSessionTimeout)
		session, err := kafkax.ConsumerGroupSessionTimeout(rctx, cl, group)
		cancel()
		if err == nil {
			err = s.set(session)
		}
		wait := consumerSessionRefresh
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			failures++
			if failures == 1 || failures%20 == 0 {
				log.Warn("publisher: reading the KIP-848 session timeout failed; the lease is not renewed until it is known", "error", err)
			}
			stats.SetError(fmt.Errorf("publisher group session timeout: %w", err))
			if s.ttl.Load() == 0 {
				wait = b.Delay(failures)
			}
		} else {
			failures = 0
		}
		if !retry.Sleep(ctx, nil, wait) {
			return
		}
	}
}
