package publish

import (
	"math/rand/v2"
	"time"
)

// Backoff computes retry delays: Min doubled per attempt up to Max, with
// jitter (a uniformly random delay between half and all of it), so that
// replicas failing together do not retry in lockstep.
type Backoff struct {
	Min, Max time.Duration
}

// Delay returns the delay before retry number attempt (0 is the first
// retry).
func (b Backoff) Delay(attempt int) time.Duration {
	d := b.Min
	for i := 0; i < attempt && d < b.Max; i++ {
		d *= 2
	}
	if d > b.Max {
		d = b.Max
	}
	if d <= 1 {
		return d
	}
	half := d / 2
	return half + rand.N(d-half+1)
}
