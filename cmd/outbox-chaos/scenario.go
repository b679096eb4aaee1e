package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/event-outbox/outbox"
)

// scenario executes one scenario action (see the scenarios list). Windows
// (small max.message.bytes) close on their own after a.d, or when ctx
// ends; their goroutines belong to h.bg, which runHarness waits for.
func (h *harness) scenario(ctx context.Context, a action) (bool, error) {
	rng := rand.New(rand.NewPCG(a.pick, 0x5ce))
	w := h.work
	switch a.kind {
	case fSlowHandler:
		if h.inj.mongo == nil || h.cfg.txnLifetime > slowLifetimeCap {
			// A handler slower than a long lifetime would outlast its
			// HandlerTimeout instead: left out.
			return false, nil
		}
		w.slowArmed.Add(int64(a.n))
	case fOutage:
		keys := make([]string, a.n)
		for i := range keys {
			keys[i] = w.keys[rng.IntN(len(w.keys))]
		}
		w.startOutage(keys, a.d, false)
		h.logf("%s keys %v down", a, keys)
		// The outage records an event of each of its keys itself: under
		// load, or late in the run, a random key may get no traffic while
		// it lasts, and the outage would park nothing to re-drive. The
		// outage lasts until one of its key's events is parked (at most
		// outageCap longer), even past the load's end (endOutages).
		h.bg.Go(func() {
			pl := plan{keys: keys, pads: make([]int, len(keys))}
			if err := h.recordPlan(context.WithoutCancel(ctx), rng, pl); err != nil {
				h.logf("%s: recording an event of each key failed: %v", a, err)
			}
		})
	case fSmallMaxBytes:
		if !w.smallLimit.CompareAndSwap(0, smallMaxMessageBytes) {
			return false, nil // a window is open already
		}
		if err := h.setMaxMessageBytes(ctx, smallMaxMessageBytes); err != nil {
			w.smallLimit.Store(0)
			return false, err
		}
		h.bg.Go(func() {
			_ = sleepCtx(ctx, a.d)
			h.closeSmallLimit()
		})
	case fKafkaDownStart:
		h.stopSlot(a.slot) // a deploy: the old version leaves gracefully
		// Black hole and refuse in turns, black hole first (a hang inside
		// an open transaction is the worse outcome).
		h.mu.Lock()
		blackHole := h.scenarios[fKafkaDownStart]%2 == 0
		h.mu.Unlock()
		if err := h.startWith(a.slot, a.d, blackHole); err != nil {
			return true, fmt.Errorf("start with Kafka down: %w", err)
		}
		h.logf("%s started with Kafka unreachable (black hole %v)", a, blackHole)
	case fPauseStorm:
		h.bg.Go(func() { h.pauseStorm(ctx, a, rng) })
	default:
		return false, fmt.Errorf("unknown scenario %q", a.kind)
	}
	return true, nil
}

// slowLifetimeCap is the longest transaction lifetime slow-handler runs
// with.
const slowLifetimeCap = 10 * time.Second

// closeSmallLimit ends a small max.message.bytes window: the topic's limit
// goes back to the default, then the operator retries the failed events.
func (h *harness) closeSmallLimit() {
	if h.work.smallLimit.Load() == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		err := h.setMaxMessageBytes(ctx, defaultMaxMessageBytes)
		if err == nil {
			break
		}
		h.logf("restoring max.message.bytes: %v", err)
		if sleepCtx(ctx, 500*time.Millisecond) != nil {
			return
		}
	}
	h.work.smallLimit.Store(0)
	h.logf("max.message.bytes restored")
}

// setMaxMessageBytes sets the topic's max.message.bytes.
func (h *harness) setMaxMessageBytes(ctx context.Context, n int) error {
	v := strconv.Itoa(n)
	res, err := kadm.NewClient(h.inj.raw).AlterTopicConfigs(ctx,
		[]kadm.AlterConfig{{Op: kadm.SetConfig, Name: "max.message.bytes", Value: &v}}, h.topic)
	if err != nil {
		return err
	}
	for _, r := range res {
		if r.Err != nil {
			return fmt.Errorf("max.message.bytes=%d: %w", n, r.Err)
		}
	}
	return nil
}

// pauseStorm records a.n large events (stormPad bytes each, handled
// slowly) on up to four keys of one partition, four consecutive events of
// one key per transaction, so that the partition's consumer queue fills
// past its byte bound and its fetching is paused and resumed many times.
//
// The root package's bound is a constant of 8 MiB (maxQueueBytes, with
// maxQueue = 5000 records): without a knob to lower it, a storm needs about
// 10 MiB of events per pause.
func (h *harness) pauseStorm(ctx context.Context, a action, rng *rand.Rand) {
	p := int32((a.pick >> 16) % uint64(h.cfg.partitions))
	part := kgo.StickyKeyPartitioner(nil).ForTopic(h.topic)
	var keys []string
	for _, k := range h.work.keys {
		if int32(part.Partition(&kgo.Record{Key: []byte(k)}, h.cfg.partitions)) == p {
			keys = append(keys, k)
			if len(keys) == 4 {
				break
			}
		}
	}
	if len(keys) == 0 {
		h.logf("%s: no key of partition %d", a, p)
		return
	}
	// Inside a small-limit window its events would all be oversize: wait
	// for the window to close.
	for h.work.smallLimit.Load() != 0 {
		if sleepCtx(ctx, 100*time.Millisecond) != nil {
			return
		}
	}
	failed := 0
	for i := 0; i < a.n; i += 4 {
		k := keys[(i/4)%len(keys)]
		pl := plan{keys: []string{k, k, k, k}, pads: []int{stormPad, stormPad, stormPad, stormPad}}
		r := h.pick(rng)
		if r == nil || ctx.Err() != nil {
			h.logf("%s on partition %d: stopped after %d transactions (load over or no replica)", a, p, i/4)
			return
		}
		tctx, cancel := context.WithTimeout(r.ctx, txnDeadline)
		stop := context.AfterFunc(ctx, cancel)
		start := time.Now()
		err := h.work.transact(tctx, r.client, r.mongo.Database(h.env.database), rng, pl)
		stop()
		cancel()
		if err != nil {
			failed++
			h.noteTxError(r, err, time.Since(start))
		}
	}
	h.logf("%s on partition %d keys %v (%d transactions failed)", a, p, keys, failed)
}

// noteTxError accounts a failed transaction.
func (h *harness) noteTxError(r *replica, err error, took time.Duration) {
	if errors.Is(err, errPlannedAbort) {
		return
	}
	if n := h.txErrors.Add(1); n <= 5 || n%1000 == 0 {
		h.logf("transaction on %s failed (%d so far): %v", r.name, n, err)
	}
}

// txnDeadline bounds every transaction of the load. A transaction on a
// replica whose Kafka is down that runs into it hung: recording waited on
// Kafka (the framework's Kafka clients retry for longer than this). How
// slow a completed transaction was is no verdict: on a loaded machine
// write-conflict retries make some take seconds whatever Kafka does, so
// the slowest ones with Kafka down and up are reported as figures only.
const txnDeadline = 20 * time.Second

// noteTxDuration keeps the slowest completed transaction of replicas with
// Kafka down and up, for the report.
func (h *harness) noteTxDuration(kafkaDown bool, took time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if kafkaDown {
		h.slowestKafkaDown = max(h.slowestKafkaDown, took)
	} else {
		h.slowestKafkaUp = max(h.slowestKafkaUp, took)
	}
}

// noteKafkaRecording checks a transaction that started while its replica's
// Kafka was unreachable: recording must not need Kafka, so a failure
// caused by Kafka, or a transaction that hung until its deadline, is a
// violation.
func (h *harness) noteKafkaRecording(r *replica, err error, took time.Duration) {
	var why string
	switch {
	case err != nil && errors.Is(err, errPlannedAbort):
	case err != nil && errors.Is(err, context.DeadlineExceeded) && took >= txnDeadline:
		why = fmt.Sprintf("hung until its %s deadline: %v", txnDeadline, err)
	case err != nil && kafkaCaused(err):
		why = err.Error()
	}
	if why == "" {
		if err == nil || errors.Is(err, errPlannedAbort) {
			h.noteTxDuration(true, took)
		}
		return
	}
	h.mu.Lock()
	h.kafkaRecordFailures++
	n := h.kafkaRecordFailures
	h.mu.Unlock()
	h.logf("recording on %s with Kafka down failed: %s", r.name, why)
	if n <= maxFailLines {
		h.addFailure(fmt.Sprintf("recording needed Kafka: a transaction on %s (Kafka unreachable) %s", r.name, why))
	}
}

// kafkaCaused reports whether a transaction failed because Kafka was
// unreachable (or because the partition count was unknown without it).
func kafkaCaused(err error) bool {
	msg := strings.ToLower(err.Error())
	return errors.Is(err, outbox.ErrTopicMetadata) || errors.Is(err, errKafkaDown) ||
		strings.Contains(msg, errKafkaDown.Error()) || strings.Contains(msg, "kafka") ||
		strings.Contains(msg, "partition count") || strings.Contains(msg, "topic metadata")
}
