package telemetry

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
)

// ErrorRelog is how often a repeated error is logged again.
const ErrorRelog = 30 * time.Second

// WaitLogEvery is how often a wait that blocks the service's start or its
// recording (MongoDB or Kafka down) is logged again: every few seconds, so
// that an operator watching the log sees what it waits for.
const WaitLogEvery = 5 * time.Second

// RateLog logs each kind of repeated message once, then at most once per
// period with the number of repeats since: an error that comes back
// thousands of times a second (a broker refusing every fetch) costs a line
// per period, not a flood.
type RateLog struct {
	every time.Duration
	mu    sync.Mutex
	seen  map[string]*rateEntry
}

type rateEntry struct {
	at      time.Time
	repeats int
}

// NewRateLog returns a RateLog that logs each kind at most once per every.
func NewRateLog(every time.Duration) *RateLog {
	return &RateLog{every: every, seen: map[string]*rateEntry{}}
}

// Warn logs msg at warning level under kind, unless kind was logged less
// than a period ago (then it only counts the repeat).
func (r *RateLog) Warn(log *slog.Logger, msg, kind string, args ...any) {
	now := time.Now()
	r.mu.Lock()
	e := r.seen[kind]
	if e != nil && now.Sub(e.at) < r.every {
		e.repeats++
		r.mu.Unlock()
		return
	}
	repeats := 0
	if e != nil {
		repeats = e.repeats
	} else {
		e = &rateEntry{}
		r.seen[kind] = e
	}
	e.at, e.repeats = now, 0
	if len(r.seen) > 1024 { // kinds come from the network: keep the map bounded
		for k, x := range r.seen {
			if now.Sub(x.at) >= r.every {
				delete(r.seen, k)
			}
		}
	}
	r.mu.Unlock()
	if repeats > 0 {
		args = append(args, "repeats_since_last_log", repeats)
	}
	log.Warn(msg, args...)
}

// ErrorKind names the kind of an error for RateLog: the Kafka error code's
// name, else the error's type.
func ErrorKind(err error) string {
	var ke *kerr.Error
	if errors.As(err, &ke) {
		return ke.Message
	}
	return fmt.Sprintf("%T", err)
}

// KerrFor is the error of a Kafka error code.
func KerrFor(code int16) error {
	if err := kerr.ErrorForCode(code); err != nil {
		return err
	}
	return fmt.Errorf("error code %d", code)
}
