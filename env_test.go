package outbox

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// ConfigFromEnv fills the connection fields from the environment without
// I/O, and reports every mistake at once, naming the variables, never a
// password.
func TestConfigFromEnv(t *testing.T) {
	t.Parallel()
	env := func(kv map[string]string) func(string) string { return func(k string) string { return kv[k] } }
	cfg, err := ConfigFromEnv(env(map[string]string{
		EnvMongoURI: "mongodb://app:s3cret@127.0.0.1:1/?replicaSet=rs0", "KAFKA_BROKERS": "b1:9092,b2:9092",
		"KAFKA_TLS": "true", "KAFKA_SASL_USER": "app", "KAFKA_SASL_PASSWORD": "s3cret", EnvReplicaID: "orders-2",
	}))
	require.NoError(t, err)
	t.Cleanup(func() { _ = cfg.Mongo.Disconnect(context.Background()) })
	require.NotNil(t, cfg.Mongo)
	require.Equal(t, []string{"b1:9092", "b2:9092"}, cfg.Brokers)
	require.Len(t, cfg.KafkaOptions, 2)
	require.Equal(t, "orders-2", cfg.ReplicaID)
	cfg.Database, cfg.Service = "shop", "shop"
	_, err = New(cfg)
	require.NoError(t, err, "a Config from the environment plus the service's own fields is valid")

	_, err = ConfigFromEnv(env(map[string]string{"KAFKA_SASL_PASSWORD": "s3cret"}))
	require.ErrorIs(t, err, ErrConfig)
	for _, name := range []string{EnvMongoURI, "KAFKA_BROKERS", "KAFKA_SASL_USER"} {
		require.ErrorContains(t, err, name)
	}
	require.NotContains(t, err.Error(), "s3cret")

	_, err = ConfigFromEnv(env(map[string]string{EnvMongoURI: "mongodb://app:s3cret@h/?replicaSet=rs0&w=bogus&connectTimeoutMS=x", "KAFKA_BROKERS": "b:1"}))
	require.ErrorContains(t, err, EnvMongoURI)
	require.NotContains(t, err.Error(), "s3cret")
}
