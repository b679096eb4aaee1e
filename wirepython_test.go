package outbox

import (
	"bytes"
	"context"
	"encoding/json"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/event-outbox/outbox/internal/wire/wiretest"
)

// pythonEventModel is a pydantic 2 model equivalent to the Event model of
// the Python event-outbox library (v0.4.0, event_outbox/outbox.py at
// commit cee2b7c): the same fields, types, defaults and extra="allow". It
// is a fast unit test that needs only python3 with pydantic 2; the live
// tests beside it (wireeventoutbox_live_test.go) run the library itself,
// relay and consumer, once .ci/install-eventoutbox has installed it. Its
// consumer does exactly Event.model_validate_json(record.value) and builds
// the inbox _id from model_dump(mode="json", include={topic,
// content_schema, idempotency_key}).
const pythonEventModel = `
import base64, json, sys, uuid
from datetime import UTC, datetime
from typing import Literal
import pydantic
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

class Event(BaseModel):
    topic: str
    content_schema: str
    partition_key: int = 0
    idempotency_key: str = Field(default_factory=lambda: uuid.uuid4().hex)
    occurred_at: AwareDatetime = Field(default_factory=lambda: datetime.now(tz=UTC))

    model_config = ConfigDict(extra="allow")
`

// pythonValidateScript validates each record value it reads (a JSON list of
// base64 values on stdin) with the library's model, as its consumer does,
// and reports the inbox _id it would use, whether re-serialising the event
// gives back the same bytes, and the library's own serialisation of the
// events of wiretest.PythonRecords.
const pythonValidateScript = pythonEventModel + `
class PaymentRequested(Event):
    topic: str = "payments"
    content_schema: Literal["PaymentRequested"] = "PaymentRequested"
    order_id: str
    account: int
    amount: float

out = {"pydantic": pydantic.VERSION, "validated": [], "produced": []}
for b64 in json.load(sys.stdin):
    value = base64.b64decode(b64)
    try:
        event = Event.model_validate_json(value)
    except pydantic.ValidationError as ex:
        out["validated"].append({"error": str(ex)})
        continue
    out["validated"].append({
        "inbox_id": event.model_dump(mode="json", include={"topic", "content_schema", "idempotency_key"}),
        "partition_key": event.partition_key,
        "occurred_at": event.occurred_at.isoformat(),
        "extra": event.model_extra,
        "same_bytes": event.model_dump_json().encode() == value,
    })
# The library's producer side: events built the way a Python service
# builds them, serialised as _EventPublisher._publish does.
out["produced"].append(PaymentRequested(partition_key=7, idempotency_key="6f1c0d4ab1e54b0e9c3c51b8a1f0d2e3",
    occurred_at=datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=UTC), order_id="o-1", account=7, amount=12.5).model_dump_json())
out["produced"].append(Event(topic="payments", content_schema="PaymentRequested", idempotency_key="0a9e7b1c2d3f4a5b8c6d7e8f90a1b2c3",
    occurred_at=datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC), order_id="o-2", account=0, amount=1.0, note="é\"<>&").model_dump_json())
json.dump(out, sys.stdout)
`

type pythonVerdict struct {
	Pydantic  string `json:"pydantic"`
	Validated []struct {
		Error        string            `json:"error"`
		InboxID      map[string]string `json:"inbox_id"`
		PartitionKey int64             `json:"partition_key"`
		OccurredAt   string            `json:"occurred_at"`
		Extra        map[string]any    `json:"extra"`
		SameBytes    bool              `json:"same_bytes"`
	} `json:"validated"`
	Produced []string `json:"produced"`
}

// requirePython returns the path of python3, skipping the test when Python
// 3 with pydantic 2 is not installed.
func requirePython(t *testing.T) string {
	t.Helper()
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 not installed")
	}
	check := exec.Command(py, "-c", "import pydantic, sys; sys.exit(0 if pydantic.VERSION.startswith('2.') else 1)")
	if err := check.Run(); err != nil {
		t.Skip("pydantic 2 not installed for python3")
	}
	return py
}

// runPython runs script with stdin under python3 (see requirePython).
func runPython(t *testing.T, py, script string, stdin []byte) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, py, "-c", script)
	cmd.Stdin = bytes.NewReader(stdin)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "python: %s", stderr.String())
	return out
}

// TestPythonModelReadsOurRecords: the events a Go service records for an
// event-outbox topic, as the publisher turns them into records (twice, as
// two deliveries), are accepted by the library's Event model with the same
// inbox _id on every delivery; re-serialising them with pydantic gives back
// our bytes. And the library's own serialisation of the events of
// wiretest.PythonRecords is byte for byte what the other tests feed our
// consumer.
func TestPythonModelReadsOurRecords(t *testing.T) {
	t.Parallel()
	py := requirePython(t)
	b := setup(t)
	c := b.client(t, wireConfig(b, "orders"))
	ctx := context.Background()
	events := []paymentRequested{
		{OrderID: "o-1", Account: 7, Amount: 12.5},
		{OrderID: "o-2", Account: -3, Amount: 0.1, Note: "é\"<>&\n\t"},
		{OrderID: "o-3", Account: 0, Amount: 1e21},
	}
	require.NoError(t, c.Transact(ctx, func(ctx context.Context) error {
		for i, e := range events {
			opts := []RecordOption{WithOccurredAt(time.Date(2026, 1, 2, 3, 4, 5, i*123456789%1e9, time.UTC))}
			if i == 0 {
				opts = append(opts, WithIdempotencyKey("fixed-key-1"))
			}
			if err := Record(ctx, e, opts...); err != nil {
				return err
			}
		}
		return nil
	}))
	cur, err := c.outbox.Find(ctx, bson.D{}, nil)
	require.NoError(t, err)
	var docs []outboxDoc
	require.NoError(t, cur.All(ctx, &docs))
	require.Len(t, docs, len(events))
	var values [][]byte
	var recs []*kgo.Record
	for _, d := range docs {
		for range 2 { // two deliveries of the same outbox document
			rec := outboxItem(&d, "").Record
			recs = append(recs, rec)
			values = append(values, rec.Value)
		}
	}
	stdin, err := json.Marshal(values) // []byte marshals as base64
	require.NoError(t, err)
	var v pythonVerdict
	require.NoError(t, json.Unmarshal(runPython(t, py, pythonValidateScript, stdin), &v))
	t.Logf("pydantic %s", v.Pydantic)
	require.Len(t, v.Validated, len(values))
	for i, got := range v.Validated {
		require.Empty(t, got.Error, "record %d: %s", i, values[i])
		env, _, err := decodeRecord(recs[i])
		require.NoError(t, err)
		require.Equal(t, map[string]string{"topic": paymentsTopic, "content_schema": "PaymentRequested",
			"idempotency_key": env.IdempotencyKey}, got.InboxID, "record %d", i)
		require.Equal(t, v.Validated[i-i%2].InboxID, got.InboxID, "same _id on every delivery")
		require.Equal(t, env.PartitionKey, itoa(int(got.PartitionKey)))
		occurred, err := time.Parse(time.RFC3339Nano, got.OccurredAt)
		require.NoError(t, err)
		require.True(t, env.OccurredAt.Equal(occurred), "%v != %v", env.OccurredAt, occurred)
		require.Equal(t, docs[i/2].IdempotencyKey, env.IdempotencyKey)
		require.Contains(t, got.Extra, "order_id")
		require.True(t, got.SameBytes, "pydantic re-serialises record %d to other bytes: %s", i, values[i])
	}
	require.Equal(t, "fixed-key-1", v.Validated[0].InboxID["idempotency_key"])

	pythonRecords := wiretest.PythonRecords(t)
	require.Len(t, v.Produced, len(pythonRecords))
	for i, pr := range pythonRecords {
		require.Equal(t, pr.Value, v.Produced[i], "the library's bytes for %s", pr.Name)
	}
}
