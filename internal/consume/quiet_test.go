package consume

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
)

// A partition whose work is all settled must end with its end offset committed
// and its fetching unpaused, with no record arriving after its last settle,
// whichever way its last records were settled: handled, skipped as duplicates
// or for want of a handler, parked, held behind a parked event, retried first,
// or past a gap in the offsets (a compacted topic, or transaction markers and
// aborted records that a read_committed consumer is never given); and whatever
// became of the commits meanwhile (failed, in flight at the last settle).
// Every case runs with a queue bound of two records, so that the partition
// pauses on the way.

// quietCase is one way a partition's last records settle.
type quietCase struct {
	name string
	mod  func(*Config)
	// seed runs before the worker starts (the inbox as an earlier owner
	// left it); the records are then at offsets 0, 1, ...
	seed func(h *harness)
	evs  []ev
	// offsets, when set, are the records' offsets (a gap: what the
	// consumer is never given), and end the offset after the last record.
	offsets []int64
	// commits: "fail" fails the commits made after the last settle,
	// "inflight" holds every commit until the last settle.
	commits string
}

var quietCases = []quietCase{
	{name: "handled", evs: []ev{{"a", "ok"}, {"b", "ok"}, {"a", "ok"}, {"", "ok"}}},
	{name: "duplicates", evs: []ev{{"a", "ok"}, {"b", "ok"}, {"a", "ok"}}, seed: func(h *harness) {
		for off, key := range []string{"a", "b", "a"} {
			h.f.seedHandled(h.tp, h.id(int64(off)), key, int64(off))
		}
	}},
	{name: "malformed", evs: []ev{{"a", "ok"}, {"b", "malformed"}, {"", "malformed"}}},
	{name: "no handler parked", evs: []ev{{"a", "ok"}, {"b", "nohandler"}, {"b", "ok"}}},
	{name: "no handler skipped", mod: func(c *Config) { c.SkipUnknown = true }, evs: []ev{{"a", "ok"}, {"b", "nohandler"}}},
	{name: "parked on request", evs: []ev{{"a", "park"}, {"b", "ok"}}},
	{name: "held behind a parked head", evs: []ev{{"a", "fail:-1"}, {"a", "ok"}, {"b", "ok"}, {"a", "ok"}}},
	{name: "retried then handled", evs: []ev{{"a", "fail:2"}, {"b", "snooze:1"}, {"c", "conflict:2"}, {"d", "locked:2"}, {"e", "infra:2"}}},
	{name: "gap at the end", evs: []ev{{"a", "ok"}, {"b", "ok"}, {"a", "ok"}}, offsets: []int64{0, 3, 7}},
	{name: "commits fail after the last settle", evs: []ev{{"a", "ok"}, {"b", "ok"}, {"c", "ok"}}, commits: "fail"},
	{name: "commit in flight at the last settle", evs: []ev{{"a", "ok"}, {"b", "ok"}, {"c", "ok"}}, commits: "inflight"},
}

func TestWorkerQuietPartitionCommitsItsEnd(t *testing.T) {
	for _, tc := range quietCases {
		for _, slots := range []int{1, 4} {
			t.Run(fmt.Sprintf("%s/%d", tc.name, slots), func(t *testing.T) {
				h := newHarnessWith(t, slots, func(c *Config) {
					c.QueueRecords = 2
					if tc.mod != nil {
						tc.mod(c)
					}
				}, tc.seed)
				gate := make(chan struct{})
				if tc.commits != "" {
					h.f.mu.Lock()
					h.f.commitGate = gate
					h.f.mu.Unlock()
				}
				recs, _ := h.records(tc.evs...)
				if tc.offsets != nil {
					for i, r := range recs {
						r.Offset = tc.offsets[i]
						r.Value = fmt.Appendf(nil, "%s|%s", h.id(r.Offset), tc.evs[i].script)
					}
					h.next = tc.offsets[len(tc.offsets)-1] + 1
				}
				// One record per poll, as the fetches of a paused and
				// resumed partition come.
				for _, r := range recs {
					h.w.Enqueue([]*kgo.Record{r})
				}
				if tc.commits != "" {
					waitFor(t, "every record settled", func() bool {
						st := h.w.Stats()
						return st.Unsettled == 0 && st.InFlight == 0 && st.LowestUnsettled == h.next
					})
					h.f.mu.Lock()
					h.f.commitGate = nil
					if tc.commits == "fail" {
						h.f.failCommits = 3
					}
					h.f.mu.Unlock()
					close(gate)
				}
				waitExplained(t, "the end committed", h.quiet, func() string {
					return fmt.Sprintf("stats %+v, commits %v", h.w.Stats(), h.f.committed(h.tp))
				})
				require.False(t, pausedNow(t, h.w, h.p), "a settled partition is left paused")
			})
		}
	}
}

// A partition revoked or lost while an event of it runs, then assigned
// again (here to the same consumer; to another one alike): its next worker
// is given the records again from the committed offset, skips those its
// earlier worker settled, and commits the end.
func TestSetReassignedPartitionCommitsItsEnd(t *testing.T) {
	for _, how := range []string{"revoke", "lose"} {
		t.Run(how, func(t *testing.T) {
			h := newSetHarness(t, func(c *Config) {
				c.Slots, c.QueueRecords, c.DrainTimeout = 4, 2, time.Millisecond
			})
			tp := TopicPartition{"orders", 1}
			id := func(off int) string { return fmt.Sprintf("%s@%d", tp, off) }
			recs := func(from int) []*kgo.Record {
				var out []*kgo.Record
				for off := from; off < 8; off++ {
					script := "ok"
					if off == 3 {
						script = "block"
					}
					out = append(out, fakeRecord(tp, int64(off), fmt.Sprint("k", off%3), id(off), script))
				}
				return out
			}
			h.s.Assign([]TopicPartition{tp})
			h.s.Enqueue(tp, recs(0))
			require.Equal(t, id(3), <-h.f.blocked)
			waitFor(t, "the other keys handled", func() bool {
				return h.f.get(id(5)).handled && h.f.get(id(7)).handled
			})
			if how == "revoke" {
				h.s.Revoke([]TopicPartition{tp})
				require.Equal(t, int64(3), h.f.lastCommit(tp), "the revoke commits what was settled")
			} else {
				h.s.Lose([]TopicPartition{tp})
			}
			from := max(h.f.lastCommit(tp), 0)
			h.f.unblock(id(3))
			h.s.Assign([]TopicPartition{tp})
			h.s.Enqueue(tp, recs(int(from)))
			waitExplained(t, "the end committed", func() bool {
				st := h.s.Stats()[tp]
				return h.f.lastCommit(tp) == 8 && st.Committed == 8 && st.Unsettled == 0
			}, func() string { return fmt.Sprintf("stats %+v, commits %v", h.s.Stats()[tp], h.f.committed(tp)) })
			require.True(t, h.f.get(id(3)).handled)
			require.False(t, h.p.isPaused(tp))
		})
	}
}

// Records the poll loop held across a revoke and a new assignment of their
// partition (polled for the earlier assignment, which fetched ahead of its
// commits) are not the new worker's: taken first, they made it drop the
// records before them, fetched again from the committed offset, as seen
// already, and commit past them unhandled. The poll's mark tells them
// apart; records of a poll that returned after the assignment are taken.
func TestSetDropsRecordsPolledBeforeItsAssignment(t *testing.T) {
	for _, how := range []string{"revoke", "lose"} {
		t.Run(how, func(t *testing.T) {
			h := newSetHarness(t, nil)
			tp := TopicPartition{"orders", 1}
			id := func(off int) string { return fmt.Sprintf("%s@%d", tp, off) }
			recs := func(from, to int) []*kgo.Record {
				var out []*kgo.Record
				for off := from; off < to; off++ {
					out = append(out, fakeRecord(tp, int64(off), fmt.Sprint("k", off%3), id(off), "ok"))
				}
				return out
			}
			h.s.Assign([]TopicPartition{tp})
			stale := h.s.Polled() // a poll returns records 4..7, fetched ahead
			if how == "revoke" {
				h.s.Revoke([]TopicPartition{tp})
			} else {
				h.s.Lose([]TopicPartition{tp})
			}
			h.s.Assign([]TopicPartition{tp})
			h.s.EnqueuePolled(tp, recs(4, 8), stale)
			// The new assignment fetches from the committed offset (none).
			h.s.EnqueuePolled(tp, recs(0, 8), h.s.Polled())
			waitFor(t, "the end committed", func() bool { return h.f.lastCommit(tp) == 8 })
			for off := range 8 {
				require.True(t, h.f.get(id(off)).handled, "offset %d handled", off)
			}
			// newSetHarness checks that no commit passed an unsettled
			// record and that each key kept its order.
		})
	}
}
