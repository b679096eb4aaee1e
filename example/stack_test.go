package main

import (
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestRedactURIHidesThePassword(t *testing.T) {
	t.Parallel()
	got := redactURI("mongodb://app:s3cret@db1:27017,db2:27017/?replicaSet=rs0")
	require.NotContains(t, got, "s3cret")
	require.Contains(t, got, "app")
	require.Equal(t, "(unparsable URI)", redactURI("mongodb://app:s3cret@[::1"))
}

func TestOpenStackNeedsBothServers(t *testing.T) {
	t.Parallel()
	log := slog.New(slog.DiscardHandler)
	for _, kv := range []map[string]string{
		{envMongoURI: "mongodb://localhost:27017/?replicaSet=rs0"},
		{envBrokers: "localhost:9092"},
	} {
		_, err := openStack(t.Context(), func(k string) string { return kv[k] }, log)
		require.ErrorContains(t, err, "set both MONGODB_URI and KAFKA_BROKERS")
	}
}

func TestListenConsecutivePorts(t *testing.T) {
	t.Parallel()
	lns, err := listen("127.0.0.1:0", 3)
	require.NoError(t, err)
	defer closeAll(lns)
	require.Len(t, lns, 3)
	_, err = listen("127.0.0.1:65535", 2)
	require.ErrorContains(t, err, "invalid port")
	_, err = listen("nonsense", 1)
	require.Error(t, err)
}
