package publish

import (
	"context"
	"sync"
	"time"
)

// Lease fences a group member that can no longer confirm its group
// session.
//
// Every heartbeat the group coordinator answers with error code 0 renews it
// with the time the request was sent (kafkax.SessionProbe): the coordinator
// knew the member, in its generation, at some time after that, so it cannot
// expire the member's session before sentAt + session timeout. Nothing else
// renews it: a response with any other error code (UNKNOWN_MEMBER_ID,
// ILLEGAL_GENERATION, REBALANCE_IN_PROGRESS...) proves no such thing. The lease is valid until sentAt + TTL, where
// TTL is the session timeout minus a safety margin. A member whose
// connection to the coordinator is cut therefore stops publishing (its
// workers pause) before the group can hand its partitions to another
// member. A lapsed lease is valid again as soon as it is renewed.
type Lease struct {
	ttl time.Duration
	now func() time.Time

	mu        sync.Mutex
	expiry    time.Time
	revokedAt time.Time
	changed   chan struct{} // closed and replaced on every renewal or revocation
	revoked   chan struct{} // closed by Revoke; replaced by the next renewal
}

// NewLease returns a lapsed lease whose renewals last ttl. now is the clock
// (time.Now when nil).
func NewLease(ttl time.Duration, now func() time.Time) *Lease {
	if now == nil {
		now = time.Now
	}
	return &Lease{ttl: ttl, now: now, changed: make(chan struct{}), revoked: make(chan struct{})}
}

// TTL returns how long a renewal lasts.
func (l *Lease) TTL() time.Duration { return l.ttl }

// Renew extends the lease to sentAt + TTL, unless it already lasts longer.
func (l *Lease) Renew(sentAt time.Time) { l.RenewFor(sentAt, l.ttl) }

// RenewFor extends the lease to sentAt + ttl, unless it already lasts
// longer: a renewal whose session timeout is not TTL's (a KIP-848 group,
// whose session timeout is the broker's). A ttl of zero or less renews
// nothing.
func (l *Lease) RenewFor(sentAt time.Time, ttl time.Duration) {
	if ttl <= 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	exp := sentAt.Add(ttl)
	if sentAt.Before(l.revokedAt) || !exp.After(l.expiry) {
		return
	}
	l.expiry = exp
	select {
	case <-l.revoked:
		l.revoked = make(chan struct{})
	default:
	}
	close(l.changed)
	l.changed = make(chan struct{})
}

// Revoke ends the lease now: batches bound to it (Bind) are cancelled and
// workers pause until the next renewal. Renewals with a send time before
// the revocation do not revive it.
func (l *Lease) Revoke() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.expiry = l.now()
	l.revokedAt = l.expiry
	select {
	case <-l.revoked:
	default:
		close(l.revoked)
	}
	close(l.changed)
	l.changed = make(chan struct{})
}

// Expiry returns the end of the lease and whether it is valid now.
func (l *Lease) Expiry() (time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.expiry, l.now().Before(l.expiry)
}

// Valid reports whether the lease is valid now.
func (l *Lease) Valid() bool {
	_, ok := l.Expiry()
	return ok
}

// Wait blocks until the lease is valid, ctx ends or stop is closed. It
// returns the expiry and true when the lease is valid.
func (l *Lease) Wait(ctx context.Context, stop <-chan struct{}) (time.Time, bool) {
	for {
		l.mu.Lock()
		exp, changed := l.expiry, l.changed
		valid := l.now().Before(exp)
		l.mu.Unlock()
		if valid {
			return exp, true
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return time.Time{}, false
		case <-stop:
			return time.Time{}, false
		}
	}
}

// Bind returns a context derived from parent that ends when the lease as
// it stands now lapses: at its current expiry, or earlier on Revoke. Call
// cancel when done with it.
func (l *Lease) Bind(parent context.Context) (context.Context, context.CancelFunc) {
	l.mu.Lock()
	exp, revoked := l.expiry, l.revoked
	// Translate the lease clock into a wall-clock deadline.
	remaining := exp.Sub(l.now())
	l.mu.Unlock()
	ctx, cancel := context.WithTimeout(parent, remaining)
	go func() {
		select {
		case <-revoked:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}
