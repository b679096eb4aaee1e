package outbox

import (
	"context"
	"strings"
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

// envMistakes returns the mistakes of a ConfigFromEnv error, one each.
func envMistakes(t testing.TB, err error) []error {
	t.Helper()
	joined, ok := err.(interface{ Unwrap() []error })
	require.True(t, ok, "%T: %v", err, err)
	return joined.Unwrap()
}

// Every mistake in the environment is reported at once, each naming its
// variable: one variable's mistake never hides another's.
func TestConfigFromEnvReportsEveryMistake(t *testing.T) {
	t.Parallel()
	env := func(kv map[string]string) func(string) string { return func(k string) string { return kv[k] } }
	_, err := ConfigFromEnv(env(map[string]string{
		"KAFKA_BROKERS": "b:1", "KAFKA_TLS": "maybe", EnvMongoURI: "not-a-uri",
		EnvReplicaID: "orders\x00" + strings.Repeat("x", 300),
	}))
	require.ErrorIs(t, err, ErrConfig)
	mistakes := envMistakes(t, err)
	require.Len(t, mistakes, 3, err.Error())
	for i, name := range []string{"KAFKA_TLS", EnvReplicaID, EnvMongoURI} {
		require.ErrorIs(t, mistakes[i], ErrConfig)
		require.ErrorContains(t, mistakes[i], name)
	}

	_, err = ConfigFromEnv(env(map[string]string{"KAFKA_BROKERS": "b:1", EnvMongoURI: "mongodb://h/?replicaSet=rs0", EnvReplicaID: "tab\there"}))
	require.ErrorIs(t, err, ErrConfig)
	require.ErrorContains(t, err, EnvReplicaID+" must be printable", "refused under the variable, not later under Config.ReplicaID")
}

// FuzzConfigFromEnv: whatever the environment holds, ConfigFromEnv
// never panics, every mistake names its variable, and no error quotes the
// SASL password.
func FuzzConfigFromEnv(f *testing.F) {
	f.Add("mongodb://127.0.0.1:1/?replicaSet=rs0", "b:9092", "true", "app", "PLAIN", "orders-1")
	f.Add("", "", "", "", "", "")
	f.Add("not-a-uri", " , ", "maybe", "", "MD5", "a\x00b")
	f.Add("mongodb://u:p@h/?w=bogus&connectTimeoutMS=x", "b:1", "yes", "app", "scram-sha-512", strings.Repeat("r", 250))
	f.Add("mongodb+srv://", "b:1", "0", "", "", "\xff")
	const password = "fuzz-s3cret-pw"
	f.Fuzz(func(t *testing.T, uri, brokers, tls, user, mech, replica string) {
		vars := map[string]string{EnvMongoURI: uri, "KAFKA_BROKERS": brokers, "KAFKA_TLS": tls,
			"KAFKA_SASL_USER": user, "KAFKA_SASL_PASSWORD": password, "KAFKA_SASL_MECHANISM": mech, EnvReplicaID: replica}
		cfg, err := ConfigFromEnv(func(k string) string { return vars[k] })
		if err == nil {
			require.NotNil(t, cfg.Mongo)
			require.NoError(t, cfg.Mongo.Disconnect(context.Background()))
			return
		}
		require.ErrorIs(t, err, ErrConfig)
		for _, e := range envMistakes(t, err) {
			require.ErrorIs(t, e, ErrConfig)
			named := false
			for name := range vars {
				named = named || strings.Contains(e.Error(), name)
			}
			require.True(t, named, "names no variable: %v", e)
		}
		if !strings.Contains(uri+brokers+tls+user+mech+replica, password) {
			require.NotContains(t, err.Error(), password)
		}
	})
}
