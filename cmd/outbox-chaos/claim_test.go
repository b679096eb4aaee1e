package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestJudgeClaims(t *testing.T) {
	t.Parallel()
	sum := padSum("pad")
	require.Empty(t, padSum(""))

	v := &verdict{}
	n, _ := judgeClaims(&claimFacts{Recorded: map[string]string{"a": sum}, Seen: map[string][]string{"a": {sum}}, OutOfBand: 1, On: true}, v)
	require.Equal(t, 1, n)
	require.Empty(t, v.all())

	// With -scheduled, a padded scheduled event handled whole is the
	// crossing of the two features; a run without one fails.
	v = &verdict{}
	n, scheduled := judgeClaims(&claimFacts{Recorded: map[string]string{"a": sum, "s": sum}, Seen: map[string][]string{"a": {sum}, "s": {sum}},
		OutOfBand: 1, On: true, Scheduled: map[string]bool{"s": true}, ScheduledOn: true}, v)
	require.Equal(t, 2, n)
	require.Equal(t, 1, scheduled)
	require.Empty(t, v.all())
	v = &verdict{}
	judgeClaims(&claimFacts{Recorded: map[string]string{"a": sum, "s": sum}, Seen: map[string][]string{"a": {sum}},
		OutOfBand: 1, On: true, Scheduled: map[string]bool{"s": true}, ScheduledOn: true}, v)
	require.Equal(t, 1, v.count("claim-scheduled-unexercised"), "the padded scheduled event was never handled")
	v = &verdict{}
	judgeClaims(&claimFacts{Recorded: map[string]string{"s": sum}, Seen: map[string][]string{"s": {padSum("pa")}},
		OutOfBand: 1, On: true, Scheduled: map[string]bool{"s": true}, ScheduledOn: true}, v)
	require.Equal(t, 1, v.count("payload-mismatch"), "a scheduled event handled with another payload")

	v = &verdict{}
	judgeClaims(&claimFacts{Recorded: map[string]string{"a": sum}, Seen: map[string][]string{"a": {padSum("pa")}}, OutOfBand: 1, On: true}, v)
	require.Equal(t, 1, v.count("payload-mismatch"))

	v = &verdict{}
	judgeClaims(&claimFacts{On: true}, v)
	require.Equal(t, 1, v.count("claim-unexercised"))

	v = &verdict{}
	judgeClaims(&claimFacts{}, v)
	require.Empty(t, v.all(), "without -claim-check nothing need go out of band")
}
