package outbox

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/event-outbox/outbox/kafkax"
)

// The environment variables ConfigFromEnv reads, besides kafkax's
// (KAFKA_BROKERS, KAFKA_TLS, KAFKA_SASL_USER, KAFKA_SASL_PASSWORD,
// KAFKA_SASL_MECHANISM; see kafkax.FromEnv).
const (
	// EnvMongoURI is the MongoDB connection string; the deployment must
	// be a replica set (a single member is fine), e.g.
	// mongodb://localhost:27017/?replicaSet=rs0.
	EnvMongoURI = "MONGODB_URI"
	// EnvReplicaID names this process (Config.ReplicaID); optional.
	EnvReplicaID = "REPLICA_ID"
)

// ConfigFromEnv returns a Config whose connection fields come from the
// environment (getenv is os.Getenv, or a map lookup in tests):
//
//   - Mongo: a client for MONGODB_URI, created without I/O (the driver
//     connects on first use, so a service starts while MongoDB is down and
//     Run waits for it);
//   - Brokers and KafkaOptions: KAFKA_BROKERS and the TLS and SASL options
//     of KAFKA_TLS, KAFKA_SASL_USER, KAFKA_SASL_PASSWORD and
//     KAFKA_SASL_MECHANISM (kafkax.FromEnv);
//   - ReplicaID: REPLICA_ID, when set.
//
// Set Database, Service, PublishTopics and the rest on the result, and
// disconnect its Mongo client when the process ends. Every mistake is
// reported at once, each naming its variable (errors joined, wrapping
// ErrConfig); no error holds a password.
func ConfigFromEnv(getenv func(string) string) (Config, error) {
	var cfg Config
	var errs []error
	kc, err := kafkax.FromEnv(getenv)
	if joined, ok := err.(interface{ Unwrap() []error }); ok {
		errs = append(errs, joined.Unwrap()...) // one ErrConfig per mistake
	} else if err != nil {
		errs = append(errs, err)
	}
	cfg.Brokers, cfg.KafkaOptions = kc.Brokers, kc.Options()
	cfg.ReplicaID = strings.TrimSpace(getenv(EnvReplicaID))
	if why := replicaIDProblem(cfg.ReplicaID); why != "" {
		errs = append(errs, fmt.Errorf("%s %s", EnvReplicaID, why))
	}
	// The URI is parsed whatever the other variables hold, so that every
	// mistake is reported at once.
	uri := strings.TrimSpace(getenv(EnvMongoURI))
	if uri == "" {
		errs = append(errs, fmt.Errorf("%s is not set: want a replica set's connection string, e.g. mongodb://localhost:27017/?replicaSet=rs0", EnvMongoURI))
	} else {
		mc, err := mongo.Connect(options.Client().ApplyURI(uri))
		if err != nil {
			// The driver's message may quote the URI: redacted.
			errs = append(errs, fmt.Errorf("%s: %s", EnvMongoURI, redactSecrets(err.Error())))
		}
		cfg.Mongo = mc
	}
	if len(errs) > 0 {
		if cfg.Mongo != nil {
			// Connect started the client's monitors; nobody else will
			// disconnect a client that is not returned.
			_ = cfg.Mongo.Disconnect(context.Background())
		}
		for i, e := range errs {
			errs[i] = fmt.Errorf("%w: %w", ErrConfig, e)
		}
		return Config{}, errors.Join(errs...)
	}
	return cfg, nil
}
