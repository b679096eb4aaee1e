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

func TestKafkaOptionsFromEnvironment(t *testing.T) {
	t.Parallel()
	env := func(kv map[string]string) func(string) string { return func(k string) string { return kv[k] } }

	opts, desc, err := kafkaOptions(env(nil))
	require.NoError(t, err)
	require.Empty(t, opts)
	require.Equal(t, "plaintext", desc)

	opts, desc, err = kafkaOptions(env(map[string]string{
		envKafkaTLS: "true", envSASLUser: "app", envSASLPassword: "s3cret", envSASLMechanism: "scram-sha-512",
	}))
	require.NoError(t, err)
	require.Len(t, opts, 2)
	require.Equal(t, "tls+sasl/SCRAM-SHA-512 user app", desc)
	require.NotContains(t, desc, "s3cret")

	for name, kv := range map[string]map[string]string{
		"bad TLS flag":      {envKafkaTLS: "maybe"},
		"user only":         {envSASLUser: "app"},
		"password only":     {envSASLPassword: "s3cret"},
		"unknown mechanism": {envSASLUser: "app", envSASLPassword: "s3cret", envSASLMechanism: "GSSAPI"},
	} {
		_, _, err := kafkaOptions(env(kv))
		require.Error(t, err, name)
		require.NotContains(t, err.Error(), "s3cret", name)
	}
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
