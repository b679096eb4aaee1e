// Package wiretest holds the test data of package wire that the root
// package's tests share: records as other implementations write them. It
// starts no goroutines.
package wiretest

import (
	_ "embed"
	"encoding/json"
	"testing"
	"time"
)

//go:embed python_records.json
var pythonRecordsJSON []byte

// PythonRecord is one record of the Python event-outbox library and the
// identity it carries.
type PythonRecord struct {
	Name           string    `json:"name"`
	Value          string    `json:"value"`
	ContentSchema  string    `json:"content_schema"`
	IdempotencyKey string    `json:"idempotency_key"`
	PartitionKey   string    `json:"partition_key"`
	OccurredAt     time.Time `json:"occurred_at"`
}

// PythonRecords returns records exactly as the Python event-outbox library
// (v0.4.0, github.com/returnnullptr/event-outbox at commit cee2b7c,
// event_outbox/outbox.py) writes them, all of topic "payments":
// _EventPublisher._publish sends event.model_dump_json().encode() with an
// explicit partition (partition_key % partitions), no key and no headers.
// The Event model's fields come first (topic, content_schema,
// partition_key, idempotency_key, occurred_at; a subclass's own fields, or
// the extra fields of extra="allow", after them). The values were printed
// by model_dump_json() of a model with the same fields under pydantic
// 2.13.4: compact JSON, non-ASCII and <>& unescaped, an aware UTC datetime
// with microseconds and "Z", and no fraction at all on a whole second.
func PythonRecords(t testing.TB) []PythonRecord {
	t.Helper()
	var recs []PythonRecord
	if err := json.Unmarshal(pythonRecordsJSON, &recs); err != nil {
		t.Fatalf("python_records.json: %v", err)
	}
	for i := range recs {
		recs[i].OccurredAt = recs[i].OccurredAt.UTC()
	}
	return recs
}
