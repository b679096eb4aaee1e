package kafkawatch

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
)

// decideRecreated's table: a recreation is taken from ids when they are
// known, from the error's length when not, and a topic the broker does not
// know is watched until it comes back.
func TestDecideRecreated(t *testing.T) {
	t.Parallel()
	now := time.Now()
	old, newID := kadm.TopicID{1}, kadm.TopicID{2}
	once := unknownTopic{first: now.Add(-time.Second), last: now.Add(-time.Second)}
	withID := once
	withID.clientID = old
	lasting := unknownTopic{first: now.Add(-2 * recreatedAfter), last: now.Add(-100 * time.Millisecond)}
	stopped := unknownTopic{first: now.Add(-3 * recreatedAfter), last: now.Add(-2 * recreatedAfter)}
	for _, c := range []struct {
		name     string
		u        unknownTopic
		known    kadm.TopicID
		brokerID kadm.TopicID
		exists   bool
		want     recreateVerdict
	}{
		{"the error's id is not the broker's", withID, kadm.TopicID{}, newID, true, verdictRecreated},
		{"a single error, the known id is not the broker's (kgo's offset fetch)", once, old, newID, true, verdictRecreated},
		{"a single error, the same id (a topic being created)", once, newID, newID, true, verdictWait},
		{"the error's id wins over the known one", withID, newID, old, true, verdictWait},
		{"deleted, not created again yet", withID, old, kadm.TopicID{}, false, verdictWait},
		{"deleted, and the errors stopped (a dropped partition)", stopped, old, kadm.TopicID{}, false, verdictWait},
		{"no id known, the error lasted", lasting, kadm.TopicID{}, newID, true, verdictRecreated},
		{"no id known, a single error", once, kadm.TopicID{}, newID, true, verdictWait},
		{"no id known, the errors stopped", stopped, kadm.TopicID{}, newID, true, verdictRecovered},
		{"the same id, the errors stopped", stopped, newID, newID, true, verdictRecovered},
	} {
		require.Equal(t, c.want, decideRecreated(c.u, c.known, nil, c.brokerID, c.exists, now), c.name)
	}
	// After a resubscription the old id's fetches may still answer once:
	// no second resubscription.
	retired := map[kadm.TopicID]bool{old: true}
	require.Equal(t, verdictRecovered, decideRecreated(stopped, newID, retired, newID, true, now), "a retired id's late error")
	require.Equal(t, verdictWait, decideRecreated(withID, newID, retired, newID, true, now), "a retired id's error, still answering")
	require.Equal(t, verdictRecreated, decideRecreated(withID, newID, nil, newID, true, now), "the same error before the resubscription")
}
