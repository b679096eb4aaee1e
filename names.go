package outbox

import (
	"fmt"
	"strings"
)

// The names Config gives to things outside the process are checked
// against the rules of the server that owns them, so that a name the
// server can never have is refused by New rather than failing every
// request of a running service (every metadata read of an illegal topic
// fails, and /readyz waits for Kafka for good).

// checkKafkaTopic reports why topic (a full Kafka topic name, with its
// TopicPrefix) is not one Kafka accepts: 1 to 249 bytes of letters,
// digits, '.', '_' and '-', and neither "." nor "..".
func checkKafkaTopic(topic string) error {
	switch {
	case topic == "":
		return fmt.Errorf("an empty name is not a legal Kafka topic")
	case len(topic) > maxNameLen:
		return fmt.Errorf("%q is longer than Kafka's %d bytes", topic, maxNameLen)
	case topic == "." || topic == "..":
		return fmt.Errorf("%q is not a legal Kafka topic", topic)
	}
	if i := strings.IndexFunc(topic, func(r rune) bool { return !kafkaTopicRune(r) }); i >= 0 {
		return fmt.Errorf("%q has %q: Kafka topics allow letters, digits, '.', '_' and '-' only", topic, []rune(topic[i:])[0])
	}
	return nil
}

// kafkaTopicRune reports whether r may appear in a Kafka topic name.
func kafkaTopicRune(r rune) bool {
	return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-'
}

// maxDatabaseLen is MongoDB's limit on a database name (fewer than 64
// bytes); maxNamespaceLen its limit on "database.collection".
const (
	maxDatabaseLen  = 63
	maxNamespaceLen = 255
)

// mongoDatabaseIllegal are the characters MongoDB refuses in a database
// name on any platform it runs on (Unix: /\. "$ and NUL; Windows adds
// *<>:|?), so that a name valid here stays valid on the next server.
const mongoDatabaseIllegal = "/\\. \"$*<>:|?\x00"

// checkMongoDatabase reports why name is not a MongoDB database name.
func checkMongoDatabase(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("is required")
	case len(name) > maxDatabaseLen:
		return fmt.Errorf("%q is longer than MongoDB's %d bytes", name, maxDatabaseLen)
	}
	if i := strings.IndexAny(name, mongoDatabaseIllegal); i >= 0 {
		return fmt.Errorf("%q has %q: MongoDB database names exclude /\\. \"$*<>:|? and NUL", name, name[i])
	}
	return nil
}

// checkMongoCollection reports why name is not a collection name this
// framework may use in database db: MongoDB refuses empty names, '$', NUL,
// the "system." prefix and namespaces over 255 bytes; the framework keeps
// its own metadata in metaCollection.
func checkMongoCollection(db, name string) error {
	switch {
	case name == "":
		return fmt.Errorf("must not be empty")
	case strings.ContainsAny(name, "$\x00"):
		return fmt.Errorf("%q has '$' or NUL, which MongoDB refuses in collection names", name)
	case strings.HasPrefix(name, "system."):
		return fmt.Errorf("%q is in MongoDB's reserved system. namespace", name)
	case name == metaCollection:
		return fmt.Errorf("must not be %q, the framework's metadata collection", metaCollection)
	case len(db)+1+len(name) > maxNamespaceLen:
		return fmt.Errorf("%q makes the namespace %s.%s longer than MongoDB's %d bytes", name, db, name, maxNamespaceLen)
	}
	return nil
}
