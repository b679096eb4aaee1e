package wire

import (
	"encoding/base64"
	"encoding/json"
	"mime"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Header names and values of CloudEvents 1.0, Kafka protocol binding.
const (
	headerCESpecVersion = "ce_specversion"
	headerCEID          = "ce_id"
	headerCESource      = "ce_source"
	headerCEType        = "ce_type"
	headerCETime        = "ce_time"
	headerCEPartKey     = "ce_partitionkey" // the partitioning extension
	headerCETraceParent = "ce_traceparent"  // the distributed tracing extension
	headerCETraceState  = "ce_tracestate"

	ceSpecVersion     = "1.0"
	contentTypeCEJSON = "application/cloudevents+json"
)

// encodeCloudEvents builds a CloudEvents 1.0 binary-mode record.
func encodeCloudEvents(env *Envelope, payload []byte) *kgo.Record {
	source := env.Source
	if source == "" {
		source = "/outbox" // an outbox document written by hand; ce_source is required
	}
	h := func(k, v string) kgo.RecordHeader { return kgo.RecordHeader{Key: k, Value: []byte(v)} }
	headers := make([]kgo.RecordHeader, 0, 9)
	headers = append(headers,
		h(headerCESpecVersion, ceSpecVersion),
		h(headerCEID, env.IdempotencyKey),
		h(headerCESource, source),
		h(headerCEType, env.ContentSchema),
		h(headerCETime, env.OccurredAt.UTC().Format(timeLayout)),
		h(HeaderContentType, contentTypeJSON),
	)
	if env.PartitionKey != "" {
		headers = append(headers, h(headerCEPartKey, env.PartitionKey))
	}
	if env.TraceParent != "" {
		headers = append(headers, h(headerCETraceParent, env.TraceParent))
	}
	if env.TraceState != "" {
		headers = append(headers, h(headerCETraceState, env.TraceState))
	}
	return &kgo.Record{Topic: env.Topic, Partition: env.Partition, Key: []byte(env.PartitionKey), Value: payload, Headers: headers}
}

// isJSONContentType reports whether a content type is JSON
// (application/json or any +json type).
func isJSONContentType(ct string) bool {
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return false
	}
	return mt == contentTypeJSON || strings.HasSuffix(mt, "+json")
}

// decodeCloudEventsBinary reads a CloudEvents binary-mode record.
func decodeCloudEventsBinary(r *kgo.Record) (Envelope, []byte, error) {
	env := Envelope{Topic: r.Topic, Partition: r.Partition, PartitionKey: string(r.Key), Format: CloudEvents}
	var specversion, ctime, partKey, contentType string
	var seenTime, seenCT bool
	for _, h := range r.Headers {
		v := string(h.Value)
		switch h.Key {
		case headerCESpecVersion:
			specversion = v
		case headerCEID:
			env.IdempotencyKey = v
		case headerCEType:
			env.ContentSchema = v
		case headerCESource:
			env.Source = v
		case headerCETime:
			ctime, seenTime = v, true
		case headerCEPartKey:
			partKey = v
		case headerCETraceParent, HeaderTraceParent:
			env.TraceParent = v
		case headerCETraceState, HeaderTraceState:
			env.TraceState = v
		case HeaderContentType:
			contentType, seenCT = v, true
		}
	}
	if r.Key == nil {
		env.PartitionKey = partKey
	}
	switch {
	case specversion != ceSpecVersion:
		return env, r.Value, malformed("unsupported %s %q (want %q)", headerCESpecVersion, specversion, ceSpecVersion)
	case env.IdempotencyKey == "":
		return env, r.Value, malformed("CloudEvents record: missing header %s (the idempotency key)", headerCEID)
	case env.ContentSchema == "":
		return env, r.Value, malformed("CloudEvents record: missing header %s (the content schema)", headerCEType)
	case seenCT && !isJSONContentType(contentType):
		return env, r.Value, malformed("CloudEvents record: content-type %q is not JSON", contentType)
	}
	if err := checkIdentity(&env, "header "+headerCEType, "header "+headerCEID); err != nil {
		return env, r.Value, err
	}
	if seenTime {
		t, err := time.Parse(time.RFC3339Nano, ctime)
		if err != nil {
			return env, r.Value, malformed("header %s: %v", headerCETime, err)
		}
		env.OccurredAt = t.UTC()
	}
	return env, r.Value, nil
}

// ceStructured is a CloudEvents structured-mode JSON event.
type ceStructured struct {
	SpecVersion     *string         `json:"specversion"`
	ID              *string         `json:"id"`
	Source          string          `json:"source"`
	Type            *string         `json:"type"`
	Time            string          `json:"time"`
	DataContentType string          `json:"datacontenttype"`
	PartitionKey    string          `json:"partitionkey"`
	TraceParent     string          `json:"traceparent"`
	TraceState      string          `json:"tracestate"`
	Data            json.RawMessage `json:"data"`
	DataBase64      *string         `json:"data_base64"`
}

// decodeCloudEventsStructured reads a CloudEvents structured-mode record:
// the payload is the event's data.
func decodeCloudEventsStructured(r *kgo.Record) (Envelope, []byte, error) {
	env := Envelope{Topic: r.Topic, Partition: r.Partition, PartitionKey: string(r.Key), Format: CloudEvents}
	var ev ceStructured
	if err := json.Unmarshal(r.Value, &ev); err != nil {
		return env, r.Value, malformed("CloudEvents structured record: %v", err)
	}
	str := func(p *string) string {
		if p == nil {
			return ""
		}
		return *p
	}
	env.IdempotencyKey, env.ContentSchema, env.Source = str(ev.ID), str(ev.Type), ev.Source
	env.TraceParent, env.TraceState = ev.TraceParent, ev.TraceState
	if r.Key == nil {
		env.PartitionKey = ev.PartitionKey
	}
	switch {
	case str(ev.SpecVersion) != ceSpecVersion:
		return env, r.Value, malformed("unsupported CloudEvents specversion %q (want %q)", str(ev.SpecVersion), ceSpecVersion)
	case env.IdempotencyKey == "":
		return env, r.Value, malformed("CloudEvents structured record: missing attribute id (the idempotency key)")
	case env.ContentSchema == "":
		return env, r.Value, malformed("CloudEvents structured record: missing attribute type (the content schema)")
	case ev.DataContentType != "" && !isJSONContentType(ev.DataContentType):
		return env, r.Value, malformed("CloudEvents structured record: datacontenttype %q is not JSON", ev.DataContentType)
	}
	if err := checkIdentity(&env, "attribute type", "attribute id"); err != nil {
		return env, r.Value, err
	}
	if ev.Time != "" {
		t, err := time.Parse(time.RFC3339Nano, ev.Time)
		if err != nil {
			return env, r.Value, malformed("CloudEvents attribute time: %v", err)
		}
		env.OccurredAt = t.UTC()
	}
	payload := []byte(ev.Data)
	if ev.DataBase64 != nil {
		b, err := base64.StdEncoding.DecodeString(*ev.DataBase64)
		if err != nil {
			return env, r.Value, malformed("CloudEvents attribute data_base64: %v", err)
		}
		payload = b
	}
	if payload == nil {
		payload = []byte("null")
	}
	return env, payload, nil
}
