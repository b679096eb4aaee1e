package outbox

import (
	"errors"
	"fmt"
	"time"
)

// Errors a handler returns to steer what happens to its event, in the
// style of river's JobCancel and JobSnooze. Any other error is retried with
// backoff and parks the event after Config.MaxAttempts attempts.

// Park returns an error that parks the event at once, without the
// remaining attempts: a permanent failure (a payload the handler will never
// accept, a business rule that refuses it). The transaction is rolled back
// as for any error; err is stored as the event's last error (nil gives
// "parked by the handler"). Under Config.PoisonPolicy HoldKey the later
// events of its partition key are held behind it.
func Park(err error) error {
	if err == nil {
		err = errors.New("parked by the handler")
	}
	return &ParkError{Err: err}
}

// ParkError is the error Park returns.
type ParkError struct {
	// Err is why the handler parked the event.
	Err error
}

func (e *ParkError) Error() string { return "park: " + e.Err.Error() }
func (e *ParkError) Unwrap() error { return e.Err }

// Snooze returns an error that rolls the transaction back and runs the
// handler again after d without using an attempt: for a dependency that is
// known to be busy, or an event that arrived before the state it needs. The
// partition waits meanwhile (its events are handled in order), so keep d
// short; the first Config.MaxSnoozes snoozes of an event are free, later
// ones count as attempts, so an event that snoozes for ever ends parked. A
// negative d is taken as 0; a snooze is cut short when the partition is
// revoked or the Client stops (the event is redelivered to its next owner).
func Snooze(d time.Duration) error { return &SnoozeError{Duration: max(d, 0)} }

// SnoozeError is the error Snooze returns.
type SnoozeError struct {
	// Duration is how long to wait before the next run.
	Duration time.Duration
}

func (e *SnoozeError) Error() string { return fmt.Sprintf("snooze for %s", e.Duration) }
