// Package wire holds the encodings of an event as a Kafka record and the
// detection of a received record's format: native (version 1), the Python
// event-outbox library's flat JSON body, and CloudEvents 1.0 (Kafka
// binding, binary mode written, binary and structured mode read). The root
// package documents the formats to users (outbox.Format) and converts its
// Envelope to and from this package's at the boundary.
//
// Everything here is a pure function of its arguments: no client, no
// configuration, no I/O, and no goroutines are started.
//
// Invariants:
//
//   - Decode never panics and never invents an identity: a record that does
//     not carry its content schema and idempotency key (the native headers,
//     ce_type and ce_id, or content_schema and idempotency_key) is refused
//     with an error naming the missing field, because an invented key would
//     turn every redelivery into a new event. Every error Decode returns
//     wraps ErrMalformed.
//   - A malformed record keeps what could be read of its identity, above all
//     its partition key, by which it holds the later events of its key.
//   - The event-outbox body is the layout of the Python library
//     (github.com/returnnullptr/event-outbox v0.4.0) as pydantic's
//     model_dump_json writes its Event model: the envelope fields first, in
//     the library's order, then the event's own fields; strings without HTML
//     escaping; occurred_at with microseconds and "Z". A record written in
//     it also carries the native headers, so native consumers read it too.
//   - Detection is by the record alone: an outbox-version header means
//     native, ce_specversion CloudEvents binary mode, a content-type of
//     application/cloudevents+json structured mode, and a JSON object value
//     with one of the library's identity fields event-outbox.
//   - The content schema and the idempotency key fit the limits MaxNameLen
//     and MaxKeyLen, so the inbox _id they make fits a MongoDB index key.
package wire
