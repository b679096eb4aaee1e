package kafkax

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

func env(kv map[string]string) func(string) string { return func(k string) string { return kv[k] } }

func TestFromEnv(t *testing.T) {
	t.Parallel()
	c, err := FromEnv(env(map[string]string{EnvBrokers: " b1:9092, b2:9092 ,"}))
	require.NoError(t, err)
	require.Equal(t, []string{"b1:9092", "b2:9092"}, c.Brokers)
	require.Empty(t, c.Options())
	require.Equal(t, "b1:9092,b2:9092 (plaintext)", c.String())

	c, err = FromEnv(env(map[string]string{
		EnvBrokers: "b1:9093", EnvTLS: "true", EnvSASLUser: "app", EnvSASLPassword: "s3cret", EnvSASLMechanism: "scram-sha-512",
	}))
	require.NoError(t, err)
	require.Len(t, c.Options(), 2)
	require.Equal(t, "b1:9093 (tls+sasl/SCRAM-SHA-512 user app)", c.String())
	for _, verb := range []string{"%v", "%+v", "%#v", "%s"} {
		require.NotContains(t, fmt.Sprintf(verb, c), "s3cret", verb)
	}

	c, err = FromEnv(env(map[string]string{EnvBrokers: "b1:9092", EnvSASLUser: "app", EnvSASLPassword: "s3cret"}))
	require.NoError(t, err)
	require.Equal(t, "PLAIN", c.SASLMechanism, "PLAIN by default")
}

// Every mistake is reported at once, naming its variable, never the
// password.
func TestFromEnvErrors(t *testing.T) {
	t.Parallel()
	_, err := FromEnv(env(map[string]string{EnvTLS: "maybe", EnvSASLPassword: "s3cret"}))
	require.ErrorContains(t, err, EnvBrokers)
	require.ErrorContains(t, err, EnvTLS)
	require.ErrorContains(t, err, EnvSASLUser)
	require.NotContains(t, err.Error(), "s3cret")
	_, err = FromEnv(env(map[string]string{EnvBrokers: "b:1", EnvSASLUser: "app", EnvSASLPassword: "s3cret", EnvSASLMechanism: "GSSAPI"}))
	require.ErrorContains(t, err, EnvSASLMechanism)
	require.NotContains(t, err.Error(), "s3cret")
}
