package outbox

import "github.com/event-outbox/outbox/internal/inboxhost"

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

// String returns "topic/schema/key", the form ParseInboxID reads, with each
// part escaped: '%', '/', control characters and bytes that are not UTF-8
// are written %XX (a key "order/42" as "order%2F42"). Any id, whatever its
// parts hold, reads back the same, and two ids never share a string (a
// content schema "OrderPlaced.v1/order" with key "42" is
// "t/OrderPlaced.v1%2Forder/42", not the "t/OrderPlaced.v1/order/42" of
// key "order/42"). The string is safe to print on a terminal and in JSON.
func (id InboxID) String() string { return inboxhost.ID(id).String() }

// ParseInboxID reads "topic/schema/key" as InboxID.String writes it: three
// parts separated by the only two slashes, each part unescaped (%XX is the
// byte XX; write a slash inside a part as %2F and a percent sign as %25).
func ParseInboxID(s string) (InboxID, error) {
	id, err := inboxhost.ParseID(s)
	return InboxID(id), err
}
