package kafkax

import (
	"context"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// SessionHook is a kgo hook (pass it to kgo.WithHooks) that reports every
// error that ends a client's consumer-group session (kgo's
// OnGroupManageError, which kgo calls after OnPartitionsLost).
//
// It does not report renewals: kgo's hooks see that a group round trip
// completed, never the error code of its response, and a heartbeat answered
// UNKNOWN_MEMBER_ID or REBALANCE_IN_PROGRESS completes like a successful
// one. A lease renewed by completed round trips would be renewed by the very
// responses that tell the member it lost its session. SessionProbe renews
// on successful responses only.
type SessionHook struct {
	// Ended receives each error that ends the group session. May be nil.
	Ended func(err error)
}

var _ kgo.HookGroupManageError = (*SessionHook)(nil)

// OnGroupManageError implements kgo.HookGroupManageError.
func (h *SessionHook) OnGroupManageError(err error) {
	if h.Ended != nil {
		h.Ended(err)
	}
}

// SessionProbe confirms a member's classic consumer-group session with
// heartbeats of its own, sent with the member id and generation the group
// client holds, and reports each heartbeat the coordinator answered with
// error code 0.
//
// A heartbeat answered 0 proves that the coordinator knew the member, in
// this generation and with no rebalance in progress, at some time after the
// request was sent; the coordinator cannot then expire the member before
// sentAt + session timeout, so a lease may be renewed from sentAt. Every
// other answer renews nothing:
//
//   - UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION, FENCED_INSTANCE_ID end the
//     session (the group may already have given the member's partitions to
//     another member). kgo learns it at its own next heartbeat and calls
//     OnPartitionsLost, where the lease is revoked; until then the lease
//     runs out by itself.
//   - REBALANCE_IN_PROGRESS is part of a normal rebalance: kgo rejoins. It
//     renews nothing either (the member's assignment is about to change),
//     and it revokes nothing: the first heartbeat of the new generation
//     renews the lease again. A rebalance longer than the lease pauses
//     publishing until it completes.
//   - A transport error or a timeout proves nothing.
//
// The extra heartbeats are harmless to a classic group (the coordinator
// only resets the member's session timer). A KIP-848 group needs
// HeartbeatTap instead (see Skip). Run is the probe's goroutine; it returns when its
// context ends.
type SessionProbe struct {
	// Group is the consumer group. Required.
	Group string
	// Member returns the member id and generation the group client holds
	// (kgo.Client.GroupMetadata). Required.
	Member func() (memberID string, generation int32)
	// Request sends a request to the group's coordinator
	// (kgo.Client.Request). Required.
	Request func(ctx context.Context, req kmsg.Request) (kmsg.Response, error)
	// Renewed receives the send time of each heartbeat answered 0.
	// Required.
	Renewed func(sentAt time.Time)
	// Interval is the time between heartbeats. Required.
	Interval time.Duration
	// Timeout bounds one heartbeat. Defaults to Interval.
	Timeout time.Duration
	// Now is the clock. Defaults to time.Now.
	Now func() time.Time
	// Skip, when set and true, skips the heartbeats: the group runs the
	// KIP-848 protocol, whose members a classic heartbeat does not know
	// (answered UNKNOWN_MEMBER_ID), and HeartbeatTap confirms the session
	// instead. May be nil.
	Skip func() bool

	kick chan struct{}
}

// Kick asks for a heartbeat now (for example when partitions were just
// assigned). It never blocks. Call it only after Init or Run started.
func (p *SessionProbe) Kick() {
	select {
	case p.kickChan() <- struct{}{}:
	default:
	}
}

// Init prepares the probe; Run calls it too. Call it before sharing the
// probe with goroutines that call Kick.
func (p *SessionProbe) Init() { p.kickChan() }

func (p *SessionProbe) kickChan() chan struct{} {
	if p.kick == nil {
		p.kick = make(chan struct{}, 1)
	}
	return p.kick
}

// Run sends a heartbeat every Interval (and on Kick) until ctx ends.
func (p *SessionProbe) Run(ctx context.Context) {
	kick := p.kickChan()
	t := time.NewTicker(p.Interval)
	defer t.Stop()
	for {
		_ = p.Probe(ctx)
		select {
		case <-t.C:
		case <-kick:
		case <-ctx.Done():
			return
		}
	}
}

// Probe sends one heartbeat and renews on error code 0. It returns why it
// did not renew (no member yet, transport error, or the response's error),
// or nil.
func (p *SessionProbe) Probe(ctx context.Context) error {
	if p.Skip != nil && p.Skip() {
		return fmt.Errorf("group %q runs the consumer protocol (KIP-848): no classic heartbeat", p.Group)
	}
	member, gen := p.Member()
	if member == "" || gen < 0 {
		return fmt.Errorf("not a member of group %q yet", p.Group)
	}
	now := time.Now
	if p.Now != nil {
		now = p.Now
	}
	req := kmsg.NewPtrHeartbeatRequest()
	req.Group = p.Group
	req.MemberID = member
	req.Generation = gen
	timeout := p.Timeout
	if timeout <= 0 {
		timeout = p.Interval
	}
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	sentAt := now() // before the request: conservative
	resp, err := p.Request(rctx, req)
	if err != nil {
		return fmt.Errorf("heartbeat to group %q: %w", p.Group, err)
	}
	hb, ok := resp.(*kmsg.HeartbeatResponse)
	if !ok {
		return fmt.Errorf("heartbeat to group %q: unexpected response %T", p.Group, resp)
	}
	if err := kerr.ErrorForCode(hb.ErrorCode); err != nil {
		return fmt.Errorf("heartbeat to group %q: %w", p.Group, err)
	}
	p.Renewed(sentAt)
	return nil
}
