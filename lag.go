package outbox

import (
	"cmp"
	"context"
	"time"

	"github.com/event-outbox/outbox/internal/retry"
	"github.com/twmb/franz-go/pkg/kadm"
)

// The lag poller.
//
// The consumer lag gauge (outbox.consumer.lag) is a partition's high
// watermark minus its committed offset. A fetch reports the high watermark,
// but a partition that is not fetched (paused behind a full queue, or
// stalled) reports nothing, so a gauge fed by fetches alone freezes at the
// lag of the moment the partition stopped and hides the stall. The lag
// poller lists the end offsets of the subscribed topics every
// lagPollInterval with the consumer's own client, so a stalled partition
// shows its lag growing as records are produced; fetches may raise the
// watermark between two listings (telemetry.noteHighWatermark). From the
// third failed listing in a row it warns (rate-limited): the gauge is
// stale.
//
// runConsumer starts the poller after creating the client and stops it
// (cancels its context and waits for it) before closing the client. A failed
// listing is retried with exponential backoff from lagPollInterval up to
// lagPollMaxBackoff; each listing is bounded by lagPollTimeout.

const (
	lagPollInterval   = 5 * time.Second
	lagPollMaxBackoff = time.Minute
	lagPollTimeout    = 10 * time.Second
)

// startLagPoller starts the lag poller of the subscribed topics. It runs
// until ctx ends or stop is called; stop waits for it to return.
func (cons *consumer) startLagPoller(ctx context.Context, topics []string) (stop func()) {
	return startStoppable(ctx, func(ctx context.Context) { cons.pollLag(ctx, topics) })
}

func (cons *consumer) pollLag(ctx context.Context, topics []string) {
	adm := kadm.NewClient(cons.cl)
	every := cmp.Or(cons.c.tel.lagEvery, lagPollInterval)
	var delay time.Duration // the first listing right away
	failures := 0
	for retry.Sleep(ctx, nil, delay) {
		lctx, cancel := context.WithTimeout(ctx, lagPollTimeout)
		listed, err := adm.ListEndOffsets(lctx, cons.c.cfg.kafkaTopics(topics)...)
		starts, serr := adm.ListStartOffsets(lctx, cons.c.cfg.kafkaTopics(topics)...)
		cancel()
		if serr == nil {
			starts.Each(func(o kadm.ListedOffset) {
				if o.Err == nil {
					cons.c.tel.setLogStart(cons.c.cfg.bareTopic(o.Topic), o.Partition, o.Offset)
				}
			})
		}
		if ctx.Err() != nil {
			return
		}
		// A listing may succeed for some partitions only: keep those.
		listed.Each(func(o kadm.ListedOffset) {
			if o.Err == nil {
				cons.c.tel.setHighWatermark(cons.c.cfg.bareTopic(o.Topic), o.Partition, o.Offset)
			}
		})
		if err == nil {
			err = listed.Error()
		}
		if err == nil {
			cons.c.tel.lagListedAt.Store(time.Now().UnixNano())
			failures = 0
			delay = every
			continue
		}
		failures++
		delay = retry.Backoff{Min: every, Max: lagPollMaxBackoff}.Delay(failures)
		if failures < 3 {
			cons.log.Debug("listing end offsets for the lag gauge failed; retrying", "err", err, "failures", failures, "retry_in", delay)
			continue
		}
		// Lasting: the lag gauge is stale, and the fetch watch probes
		// quiet partitions without it (fetchwatch.go).
		cons.errLog.warn(cons.log, "listing end offsets keeps failing: the consumer lag gauge is stale", "lag-listing",
			"err", err, "failures", failures, "retry_in", delay)
	}
}
