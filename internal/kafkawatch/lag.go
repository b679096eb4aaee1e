package kafkawatch

import (
	"cmp"
	"context"
	"log/slog"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/event-outbox/outbox/internal/retry"
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
// watermark between two listings (the root's telemetry.noteHighWatermark).
// From the third failed listing in a row it warns (rate-limited): the gauge
// is stale.
//
// The consumer starts the poller after creating the client and stops it
// (cancels its context and waits for it) before closing the client. A failed
// listing is retried with exponential backoff from lagPollInterval up to
// lagPollMaxBackoff; each listing is bounded by lagPollTimeout.

const (
	lagPollInterval   = 5 * time.Second
	lagPollMaxBackoff = time.Minute
	lagPollTimeout    = 10 * time.Second
)

// LagPoller lists the end and start offsets of the consumer's topics for
// the lag gauge (see the comment at the top of the file). The consumer
// fills it in and calls Run on a goroutine of its own.
type LagPoller struct {
	// Client is the consumer's group client.
	Client *kgo.Client
	// Topics are the topics to list, as Kafka names them.
	Topics []string
	// Every is the period of the listings (0: lagPollInterval).
	Every time.Duration
	// SetHighWatermark and SetLogStart take a listed partition's offsets;
	// Listed hears the time of each listing that succeeded for every
	// partition. Topics are as Kafka names them.
	SetHighWatermark func(topic string, partition int32, offset int64)
	SetLogStart      func(topic string, partition int32, offset int64)
	Listed           func(at time.Time)
	// Log takes the first failures of a row (debug); Warn, rate-limited
	// by the caller, takes the lasting ones.
	Log  *slog.Logger
	Warn func(msg string, args ...any)
}

// Run polls until ctx ends.
func (p *LagPoller) Run(ctx context.Context) {
	adm := kadm.NewClient(p.Client)
	every := cmp.Or(p.Every, lagPollInterval)
	var delay time.Duration // the first listing right away
	failures := 0
	for retry.Sleep(ctx, nil, delay) {
		lctx, cancel := context.WithTimeout(ctx, lagPollTimeout)
		listed, err := adm.ListEndOffsets(lctx, p.Topics...)
		starts, serr := adm.ListStartOffsets(lctx, p.Topics...)
		cancel()
		if serr == nil {
			starts.Each(func(o kadm.ListedOffset) {
				if o.Err == nil {
					p.SetLogStart(o.Topic, o.Partition, o.Offset)
				}
			})
		}
		if ctx.Err() != nil {
			return
		}
		// A listing may succeed for some partitions only: keep those.
		listed.Each(func(o kadm.ListedOffset) {
			if o.Err == nil {
				p.SetHighWatermark(o.Topic, o.Partition, o.Offset)
			}
		})
		if err == nil {
			err = listed.Error()
		}
		if err == nil {
			p.Listed(time.Now())
			failures = 0
			delay = every
			continue
		}
		failures++
		delay = retry.Backoff{Min: every, Max: lagPollMaxBackoff}.Delay(failures)
		if failures < 3 {
			p.Log.Debug("listing end offsets for the lag gauge failed; retrying", "err", err, "failures", failures, "retry_in", delay)
			continue
		}
		// Lasting: the lag gauge is stale, and the fetch watch probes
		// quiet partitions without it (fetch.go).
		p.Warn("listing end offsets keeps failing: the consumer lag gauge is stale",
			"err", err, "failures", failures, "retry_in", delay)
	}
}
