package kafkax

import (
	"crypto/tls"
	"errors"
	"fmt"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

// The environment variables FromEnv reads.
const (
	// EnvBrokers lists the seed brokers, comma-separated
	// ("broker1:9092,broker2:9092").
	EnvBrokers = "KAFKA_BROKERS"
	// EnvTLS is "true" (or "1", "yes") to dial the brokers with TLS,
	// verified against the system's roots; "false", "0", "no" or unset
	// for plaintext.
	EnvTLS = "KAFKA_TLS"
	// EnvSASLUser and EnvSASLPassword are SASL credentials; set both or
	// neither. The password is never logged or printed.
	EnvSASLUser     = "KAFKA_SASL_USER"
	EnvSASLPassword = "KAFKA_SASL_PASSWORD"
	// EnvSASLMechanism is PLAIN (the default), SCRAM-SHA-256 or
	// SCRAM-SHA-512.
	EnvSASLMechanism = "KAFKA_SASL_MECHANISM"
)

// Connection is how to reach a Kafka cluster: its brokers, TLS and SASL.
// Its String never holds the password.
type Connection struct {
	// Brokers are the seed brokers (host:port).
	Brokers []string
	// TLS dials the brokers with TLS, verified against the system's roots.
	TLS bool
	// SASLMechanism is "" (no SASL), "PLAIN", "SCRAM-SHA-256" or
	// "SCRAM-SHA-512"; SASLUser the user name.
	SASLMechanism, SASLUser string

	password string
}

// FromEnv reads a Connection from the environment variables above (getenv
// is os.Getenv, or a map lookup in tests). It fails, naming the variable
// and never quoting the password, when KAFKA_BROKERS is unset or empty, a
// value is invalid, or only one of the SASL credentials is set.
func FromEnv(getenv func(string) string) (Connection, error) {
	var c Connection
	var errs []error
	for _, b := range strings.Split(getenv(EnvBrokers), ",") {
		if b = strings.TrimSpace(b); b != "" {
			c.Brokers = append(c.Brokers, b)
		}
	}
	if len(c.Brokers) == 0 {
		errs = append(errs, fmt.Errorf("%s is not set: want the seed brokers, e.g. localhost:9092", EnvBrokers))
	}
	switch v := strings.ToLower(strings.TrimSpace(getenv(EnvTLS))); v {
	case "", "0", "false", "no":
	case "1", "true", "yes":
		c.TLS = true
	default:
		errs = append(errs, fmt.Errorf("%s=%q: want true or false", EnvTLS, v))
	}
	user, pass := getenv(EnvSASLUser), getenv(EnvSASLPassword)
	switch {
	case user == "" && pass == "":
	case user == "" || pass == "":
		errs = append(errs, fmt.Errorf("set both %s and %s for SASL, or neither", EnvSASLUser, EnvSASLPassword))
	default:
		c.SASLUser, c.password = user, pass
		switch mech := strings.ToUpper(strings.TrimSpace(getenv(EnvSASLMechanism))); mech {
		case "", "PLAIN":
			c.SASLMechanism = "PLAIN"
		case "SCRAM-SHA-256", "SCRAM-SHA-512":
			c.SASLMechanism = mech
		default:
			errs = append(errs, fmt.Errorf("%s=%q: want PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512", EnvSASLMechanism, mech))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return Connection{}, err
	}
	return c, nil
}

// Options returns the client options for TLS and SASL, for
// outbox.Config.KafkaOptions or kgo.NewClient (the brokers go to
// outbox.Config.Brokers or kgo.SeedBrokers). None for a plaintext cluster
// without SASL.
func (c Connection) Options() []kgo.Opt {
	var opts []kgo.Opt
	if c.TLS {
		opts = append(opts, kgo.DialTLSConfig(&tls.Config{MinVersion: tls.VersionTLS12}))
	}
	switch c.SASLMechanism {
	case "PLAIN":
		opts = append(opts, kgo.SASL(plain.Auth{User: c.SASLUser, Pass: c.password}.AsMechanism()))
	case "SCRAM-SHA-256":
		opts = append(opts, kgo.SASL(scram.Auth{User: c.SASLUser, Pass: c.password}.AsSha256Mechanism()))
	case "SCRAM-SHA-512":
		opts = append(opts, kgo.SASL(scram.Auth{User: c.SASLUser, Pass: c.password}.AsSha512Mechanism()))
	}
	return opts
}

// String describes the connection for logs, without the password:
// "broker1:9092,broker2:9092 (tls+sasl/PLAIN user app)".
func (c Connection) String() string {
	sec := "plaintext"
	if c.TLS {
		sec = "tls"
	}
	if c.SASLMechanism != "" {
		sec += "+sasl/" + c.SASLMechanism + " user " + c.SASLUser
	}
	return strings.Join(c.Brokers, ",") + " (" + sec + ")"
}

// GoString is String, so that %#v does not print the password either.
func (c Connection) GoString() string { return c.String() }
