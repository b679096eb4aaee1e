package main

import (
	"fmt"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
)

// Processes started separately (the README's dev-stack recipe, Docker
// Compose) must not all call themselves "replica 1".
func TestReplicaNamesDifferBetweenProcesses(t *testing.T) {
	t.Parallel()
	host, err := os.Hostname()
	require.NoError(t, err)
	names, err := replicaNames("", 1)
	require.NoError(t, err)
	require.Equal(t, []string{fmt.Sprintf("%s-%d", host, os.Getpid())}, names,
		"by default a process is named after its host and process id")

	names, err = replicaNames("orders-a", 1)
	require.NoError(t, err)
	require.Equal(t, []string{"orders-a"}, names)
	names, err = replicaNames("orders-a", 3)
	require.NoError(t, err)
	require.Equal(t, []string{"orders-a-r1", "orders-a-r2", "orders-a-r3"}, names)

	for _, bad := range []string{"has space", "slash/y", string(make([]byte, 65))} {
		_, err := replicaNames(bad, 1)
		require.ErrorContains(t, err, "-replica-id", "%q", bad)
	}
}
