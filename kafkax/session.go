package kafkax

import (
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// SessionHook is a kgo hook (pass it to kgo.WithHooks) that reports the
// health of a client's consumer-group session: every completed round trip
// of a group request that keeps the session alive (Heartbeat, JoinGroup,
// SyncGroup, ConsumerGroupHeartbeat) and every error that ends the session.
//
// A completed round trip proves that the coordinator saw the member alive
// at some time after the request was sent, so the coordinator cannot expire
// the member before sentAt + session timeout. Responses carrying an error
// code also count: kgo reports the errors that end a session through
// OnGroupManageError right after, which is where a lease must be revoked.
type SessionHook struct {
	// Renewed receives the time each such request was sent. Required.
	Renewed func(sentAt time.Time)
	// Ended receives each error that ends the group session. May be nil.
	Ended func(err error)
	// Now is the clock. Defaults to time.Now.
	Now func() time.Time
}

var (
	_ kgo.HookBrokerE2E        = (*SessionHook)(nil)
	_ kgo.HookGroupManageError = (*SessionHook)(nil)
)

// IsSessionKey reports whether a request key keeps a group session alive.
func IsSessionKey(key int16) bool {
	switch kmsg.Key(key) {
	case kmsg.Heartbeat, kmsg.JoinGroup, kmsg.SyncGroup, kmsg.ConsumerGroupHeartbeat:
		return true
	}
	return false
}

// OnBrokerE2E implements kgo.HookBrokerE2E.
func (h *SessionHook) OnBrokerE2E(_ kgo.BrokerMetadata, key int16, e2e kgo.BrokerE2E) {
	if !IsSessionKey(key) || e2e.Err() != nil || e2e.BytesRead == 0 {
		return
	}
	now := time.Now
	if h.Now != nil {
		now = h.Now
	}
	// WriteWait is spent before the request hits the wire; the send time is
	// the start of the write.
	h.Renewed(now().Add(-e2e.DurationE2E()))
}

// OnGroupManageError implements kgo.HookGroupManageError.
func (h *SessionHook) OnGroupManageError(err error) {
	if h.Ended != nil {
		h.Ended(err)
	}
}
