package mongotest_test

import (
	"context"
	"fmt"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/event-outbox/outbox/mongox/mongotest"
)

// A test with its own database. The body of the function given to
// exampleTest is what goes in a TestXxx function.
func Example() {
	exampleTest(func(t testing.TB) {
		env := mongotest.StartEmbedded(t) // mongotest.Start(t) honours OUTBOX_TEST_MONGODB_URI
		db := env.DB(t)                   // unique name, dropped in t.Cleanup
		ctx := context.Background()
		if _, err := db.Collection("orders").InsertOne(ctx, bson.D{{Key: "_id", Value: 1}, {Key: "total", Value: 42}}); err != nil {
			t.Fatal(err)
		}
		var got struct{ Total int }
		if err := db.Collection("orders").FindOne(ctx, bson.D{{Key: "_id", Value: 1}}).Decode(&got); err != nil {
			t.Fatal(err)
		}
		fmt.Println("total:", got.Total)
	})
	// Output: total: 42
}

// Embedded only: make the next insert fail with a write conflict through
// MongoDB's own test interface, the configureFailPoint command.
func Example_failPoint() {
	exampleTest(func(t testing.TB) {
		env := mongotest.StartEmbedded(t)
		ctx := context.Background()
		err := env.Client.Database("admin").RunCommand(ctx, bson.D{
			{Key: "configureFailPoint", Value: "failCommand"},
			{Key: "mode", Value: bson.D{{Key: "times", Value: 1}}},
			{Key: "data", Value: bson.D{{Key: "failCommands", Value: bson.A{"insert"}}, {Key: "errorCode", Value: 112}}},
		}).Err()
		if err != nil {
			t.Fatal(err)
		}
		coll := env.DB(t).Collection("c")
		_, err = coll.InsertOne(ctx, bson.D{{Key: "_id", Value: 1}})
		fmt.Println("first insert failed:", err != nil)
		_, err = coll.InsertOne(ctx, bson.D{{Key: "_id", Value: 1}})
		fmt.Println("second insert failed:", err != nil)
	})
	// Output:
	// first insert failed: true
	// second insert failed: false
}

// exampleTest runs fn with a minimal testing.TB so that the example can run
// outside a test function. Real tests pass their own *testing.T instead.
func exampleTest(fn func(t testing.TB)) {
	tb := &exampleTB{}
	defer tb.cleanup()
	fn(tb)
}

type exampleTB struct {
	testing.TB // only the methods below are used
	cleanups   []func()
}

func (*exampleTB) Helper()                        {}
func (*exampleTB) Name() string                   { return "Example" }
func (*exampleTB) Logf(format string, a ...any)   { fmt.Printf(format+"\n", a...) }
func (*exampleTB) Errorf(format string, a ...any) { fmt.Printf(format+"\n", a...) }
func (*exampleTB) Fatal(a ...any)                 { panic(fmt.Sprint(a...)) }
func (*exampleTB) Fatalf(format string, a ...any) { panic(fmt.Sprintf(format, a...)) }
func (tb *exampleTB) Cleanup(f func())            { tb.cleanups = append(tb.cleanups, f) }
func (tb *exampleTB) cleanup() {
	for i := len(tb.cleanups) - 1; i >= 0; i-- {
		tb.cleanups[i]()
	}
}
