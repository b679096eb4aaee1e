package conformance

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/event-outbox/outbox/mongox/mongotest"
)

// caseTimeout bounds every case's operations, so that a server that never
// answers fails the case instead of hanging the suite.
const caseTimeout = 60 * time.Second

// setup returns the deployment for one case, a fresh database on it and a
// context bounded by caseTimeout.
func setup(t *testing.T, env EnvFunc, opts ...mongotest.Option) (*mongotest.Env, *mongo.Database, context.Context) {
	t.Helper()
	e := env(t, opts...)
	db := e.DB(t)
	return e, db, testCtx(t)
}

// testCtx returns a context that ends after caseTimeout or when the test ends.
func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), caseTimeout)
	t.Cleanup(cancel)
	return ctx
}

// embeddedOnly skips the case against a real MongoDB, naming why.
func embeddedOnly(t *testing.T, e *mongotest.Env, why string) {
	t.Helper()
	if e.Real {
		t.Skipf("embedded server only: %s", why)
	}
}

// D parses relaxed or canonical extended JSON into a document; it panics on
// malformed input (a bug in the case itself).
func D(extJSON string) bson.D {
	var d bson.D
	if err := bson.UnmarshalExtJSON([]byte(extJSON), false, &d); err != nil {
		panic(fmt.Sprintf("conformance: bad extended JSON %s: %v", extJSON, err))
	}
	return d
}

// Ds parses a JSON array of documents.
func Ds(extJSON string) []any {
	var wrapper bson.D
	if err := bson.UnmarshalExtJSON([]byte(`{"a":`+extJSON+`}`), false, &wrapper); err != nil {
		panic(fmt.Sprintf("conformance: bad extended JSON array %s: %v", extJSON, err))
	}
	arr := wrapper[0].Value.(bson.A)
	out := make([]any, len(arr))
	copy(out, arr)
	return out
}

// js renders a value as canonical extended JSON, which shows BSON types
// ($numberInt vs $numberLong vs $numberDouble), for failure messages and
// exact comparisons.
func js(v any) string {
	switch x := v.(type) {
	case bson.Raw:
		return x.String()
	case []bson.D:
		parts := make([]string, len(x))
		for i, d := range x {
			parts[i] = js(d)
		}
		return "[" + strings.Join(parts, ", ") + "]"
	case bson.A, []any:
		b, err := bson.MarshalExtJSON(bson.D{{Key: "v", Value: x}}, true, false)
		if err != nil {
			return fmt.Sprintf("%#v", v)
		}
		s := string(b)
		return strings.TrimSuffix(strings.TrimPrefix(s, `{"v":`), "}")
	}
	b, err := bson.MarshalExtJSON(v, true, false)
	if err != nil {
		return fmt.Sprintf("%#v", v)
	}
	return string(b)
}

// requireDocs asserts that got holds exactly the documents of want (extended
// JSON array), in order, field order and BSON types included.
func requireDocs(t *testing.T, want string, got []bson.D, msgAndArgs ...any) {
	t.Helper()
	wantDocs := make([]bson.D, 0)
	for _, w := range Ds(want) {
		wantDocs = append(wantDocs, w.(bson.D))
	}
	require.Equal(t, js(wantDocs), js(got), msgAndArgs...)
}

// requireDoc asserts one document like requireDocs.
func requireDoc(t *testing.T, want string, got bson.D, msgAndArgs ...any) {
	t.Helper()
	require.Equal(t, js(D(want)), js(got), msgAndArgs...)
}

// all drains a cursor.
func all(t *testing.T, ctx context.Context, cur *mongo.Cursor, err error) []bson.D {
	t.Helper()
	require.NoError(t, err)
	out := []bson.D{}
	require.NoError(t, cur.All(ctx, &out))
	return out
}

// find returns the documents matching filter, sorted by _id unless opts say
// otherwise.
func find(t *testing.T, ctx context.Context, coll *mongo.Collection, filter any, opts ...options.Lister[options.FindOptions]) []bson.D {
	t.Helper()
	if len(opts) == 0 {
		opts = append(opts, options.Find().SetSort(bson.D{{Key: "_id", Value: 1}}))
	}
	cur, err := coll.Find(ctx, filter, opts...)
	return all(t, ctx, cur, err)
}

// ids returns the _id values of find(filter) in _id order, as canonical JSON.
func ids(t *testing.T, ctx context.Context, coll *mongo.Collection, filter any) string {
	t.Helper()
	docs := find(t, ctx, coll, filter)
	out := bson.A{}
	for _, d := range docs {
		out = append(out, get(d, "_id"))
	}
	return js(out)
}

// get returns the top-level field key of d, or nil.
func get(d bson.D, key string) any {
	for _, e := range d {
		if e.Key == key {
			return e.Value
		}
	}
	return nil
}

// insert inserts documents given as an extended JSON array.
func insert(t *testing.T, ctx context.Context, coll *mongo.Collection, docs string) {
	t.Helper()
	_, err := coll.InsertMany(ctx, Ds(docs))
	require.NoError(t, err)
}

// serverError returns err as a mongo.ServerError, failing the test if it is
// not one.
func serverError(t *testing.T, err error) mongo.ServerError {
	t.Helper()
	require.Error(t, err)
	var se mongo.ServerError
	require.True(t, errors.As(err, &se), "want a server error, got %T: %v", err, err)
	return se
}

// requireCode asserts that err is a server error carrying code.
func requireCode(t *testing.T, err error, code int, msgAndArgs ...any) {
	t.Helper()
	se := serverError(t, err)
	require.True(t, se.HasErrorCode(code), "want error code %d, got codes %v: %v %v", code, se.ErrorCodes(), err, fmt.Sprint(msgAndArgs...))
}

// commandLog records the commands a client sends and their replies.
type commandLog struct {
	mu        sync.Mutex
	started   []*event.CommandStartedEvent
	succeeded []*event.CommandSucceededEvent
	failed    []*event.CommandFailedEvent
}

// monitoredClient returns a new client on e whose commands are recorded.
func monitoredClient(t *testing.T, e *mongotest.Env, opts ...*options.ClientOptions) (*mongo.Client, *commandLog) {
	t.Helper()
	log := &commandLog{}
	mon := &event.CommandMonitor{
		Started: func(_ context.Context, ev *event.CommandStartedEvent) {
			log.mu.Lock()
			defer log.mu.Unlock()
			log.started = append(log.started, ev)
		},
		Succeeded: func(_ context.Context, ev *event.CommandSucceededEvent) {
			log.mu.Lock()
			defer log.mu.Unlock()
			log.succeeded = append(log.succeeded, ev)
		},
		Failed: func(_ context.Context, ev *event.CommandFailedEvent) {
			log.mu.Lock()
			defer log.mu.Unlock()
			log.failed = append(log.failed, ev)
		},
	}
	all := append([]*options.ClientOptions{options.Client().SetMonitor(mon)}, opts...)
	return e.NewClient(t, all...), log
}

// count returns how many commands named name were started.
func (l *commandLog) count(name string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, ev := range l.started {
		if ev.CommandName == name {
			n++
		}
	}
	return n
}

// reply returns the last successful reply of the command named name.
func (l *commandLog) reply(name string) bson.Raw {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := len(l.succeeded) - 1; i >= 0; i-- {
		if l.succeeded[i].CommandName == name {
			return l.succeeded[i].Reply
		}
	}
	return nil
}

// eventually polls cond every 10 ms until it holds or the deadline passes.
func eventually(t *testing.T, deadline time.Duration, what string, cond func() bool) {
	t.Helper()
	end := time.Now().Add(deadline)
	for !cond() {
		if time.Now().After(end) {
			t.Fatalf("%s: not true after %v", what, deadline)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// rawDoc decodes a raw document.
func rawDoc(t *testing.T, raw bson.Raw) bson.D {
	t.Helper()
	var d bson.D
	require.NoError(t, bson.Unmarshal(raw, &d))
	return d
}

// num renders a numeric raw value as a plain decimal string whatever its
// BSON number type ("" when it is missing or not a number).
func num(v bson.RawValue) string {
	if f, ok := v.AsFloat64OK(); ok {
		return fmt.Sprint(f)
	}
	return ""
}
