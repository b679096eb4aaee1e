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
	n := judgeClaims(&claimFacts{Recorded: map[string]string{"a": sum}, Seen: map[string][]string{"a": {sum}}, OutOfBand: 1, On: true}, v)
	require.Equal(t, 1, n)
	require.Empty(t, v.all())

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
