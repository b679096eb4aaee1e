package kafkax

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

func TestSessionHookRenewsWithSendTime(t *testing.T) {
	t.Parallel()
	now := time.Unix(100, 0)
	var renewed []time.Time
	var ended []error
	h := &SessionHook{
		Renewed: func(at time.Time) { renewed = append(renewed, at) },
		Ended:   func(err error) { ended = append(ended, err) },
		Now:     func() time.Time { return now },
	}
	ok := kgo.BrokerE2E{BytesRead: 10, WriteWait: time.Second, TimeToWrite: time.Millisecond, ReadWait: 20 * time.Millisecond, TimeToRead: time.Millisecond}
	h.OnBrokerE2E(kgo.BrokerMetadata{}, int16(kmsg.Heartbeat), ok)
	require.Equal(t, []time.Time{now.Add(-22 * time.Millisecond)}, renewed, "renewed with the send time, WriteWait excluded")

	for _, key := range []kmsg.Key{kmsg.JoinGroup, kmsg.SyncGroup, kmsg.ConsumerGroupHeartbeat} {
		h.OnBrokerE2E(kgo.BrokerMetadata{}, int16(key), ok)
	}
	require.Len(t, renewed, 4)

	// Not a session request, or a failed round trip: no renewal.
	h.OnBrokerE2E(kgo.BrokerMetadata{}, int16(kmsg.Produce), ok)
	h.OnBrokerE2E(kgo.BrokerMetadata{}, int16(kmsg.Heartbeat), kgo.BrokerE2E{ReadErr: errors.New("eof")})
	h.OnBrokerE2E(kgo.BrokerMetadata{}, int16(kmsg.Heartbeat), kgo.BrokerE2E{WriteErr: errors.New("reset")})
	require.Len(t, renewed, 4)

	h.OnGroupManageError(errors.New("UNKNOWN_MEMBER_ID"))
	require.Len(t, ended, 1)
	(&SessionHook{Renewed: func(time.Time) {}}).OnGroupManageError(errors.New("x")) // nil Ended is fine
}
