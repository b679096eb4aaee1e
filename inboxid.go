package outbox

import (
	"fmt"
	"strings"
)

// InboxID is the inbox document _id of an event: an ordered subdocument
// {topic, content_schema, idempotency_key}, the field names and order of
// the Python event-outbox library, so that services written with either
// share an inbox during a migration. Two deliveries of the same event (same
// topic, content schema and idempotency key) share it.
type InboxID struct {
	Topic          string `bson:"topic" json:"topic"`
	ContentSchema  string `bson:"content_schema" json:"content_schema"`
	IdempotencyKey string `bson:"idempotency_key" json:"idempotency_key"`
}

func inboxIDOf(env *Envelope) InboxID {
	return InboxID{Topic: env.Topic, ContentSchema: env.ContentSchema, IdempotencyKey: env.IdempotencyKey}
}

// String returns "topic/schema/key", the form ParseInboxID reads.
func (id InboxID) String() string {
	return id.Topic + "/" + id.ContentSchema + "/" + id.IdempotencyKey
}

// ParseInboxID reads "topic/schema/key": the topic ends at the first slash
// (Kafka topic names have none) and the key starts after the last one, so
// a content schema may contain slashes and an idempotency key may not.
func ParseInboxID(s string) (InboxID, error) {
	i, j := strings.IndexByte(s, '/'), strings.LastIndexByte(s, '/')
	if i <= 0 || j <= i+1 || j == len(s)-1 {
		return InboxID{}, fmt.Errorf("outbox: inbox id %q: want topic/schema/key", s)
	}
	return InboxID{Topic: s[:i], ContentSchema: s[i+1 : j], IdempotencyKey: s[j+1:]}, nil
}
