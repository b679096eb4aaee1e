package kafkax

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

func TestSessionHookReportsEnd(t *testing.T) {
	t.Parallel()
	var ended []error
	h := &SessionHook{Ended: func(err error) { ended = append(ended, err) }}
	h.OnGroupManageError(errors.New("UNKNOWN_MEMBER_ID"))
	require.Len(t, ended, 1)
	(&SessionHook{}).OnGroupManageError(errors.New("x")) // nil Ended is fine
}

// Issue 12, item 7: only a heartbeat answered with error code 0 renews; the
// codes that end a session, a rebalance in progress and transport errors do
// not.
func TestSessionProbeRenewsOnSuccessOnly(t *testing.T) {
	t.Parallel()
	now := time.Unix(100, 0)
	var renewed []time.Time
	var code int16
	var reqErr error
	var got *kmsg.HeartbeatRequest
	member, gen := "m-1", int32(7)
	p := &SessionProbe{
		Group:  "g",
		Member: func() (string, int32) { return member, gen },
		Request: func(_ context.Context, req kmsg.Request) (kmsg.Response, error) {
			got = req.(*kmsg.HeartbeatRequest)
			now = now.Add(30 * time.Millisecond) // the round trip
			if reqErr != nil {
				return nil, reqErr
			}
			resp := kmsg.NewPtrHeartbeatResponse()
			resp.ErrorCode = code
			return resp, nil
		},
		Renewed:  func(at time.Time) { renewed = append(renewed, at) },
		Interval: time.Second,
		Now:      func() time.Time { return now },
	}
	ctx := context.Background()

	sent := now
	require.NoError(t, p.Probe(ctx))
	require.Equal(t, []time.Time{sent}, renewed, "renewed with the send time")
	require.Equal(t, "g", got.Group)
	require.Equal(t, "m-1", got.MemberID)
	require.EqualValues(t, 7, got.Generation)

	for _, e := range []*kerr.Error{kerr.UnknownMemberID, kerr.IllegalGeneration, kerr.FencedInstanceID,
		kerr.RebalanceInProgress, kerr.CoordinatorNotAvailable, kerr.NotCoordinator} {
		code = e.Code
		err := p.Probe(ctx)
		require.ErrorIs(t, err, e)
	}
	code = 0
	reqErr = errors.New("connection reset")
	require.Error(t, p.Probe(ctx))
	reqErr = nil
	member = ""
	require.Error(t, p.Probe(ctx), "no member id yet: no heartbeat")
	require.Len(t, renewed, 1, "only the heartbeat answered 0 renewed")
}

func TestSessionProbeRunsUntilCancelled(t *testing.T) {
	t.Parallel()
	renewed := make(chan time.Time, 100)
	p := &SessionProbe{
		Group:  "g",
		Member: func() (string, int32) { return "m", 1 },
		Request: func(context.Context, kmsg.Request) (kmsg.Response, error) {
			return kmsg.NewPtrHeartbeatResponse(), nil
		},
		Renewed:  func(at time.Time) { renewed <- at },
		Interval: time.Hour,
	}
	p.Init()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); p.Run(ctx) }()
	<-renewed // the first heartbeat goes at once
	p.Kick()
	<-renewed
	cancel()
	<-done
}
