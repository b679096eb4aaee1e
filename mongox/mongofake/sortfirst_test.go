package mongofake

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/event-outbox/outbox/mongox/internal/bsonkit"
	"github.com/event-outbox/outbox/mongox/internal/query"
)

// sortAllThenCut is the reference: a stable sort of every document, then
// skip and limit.
func sortAllThenCut(docs []bson.D, srt *query.Sort, skip, limit int64, coll *bsonkit.Collation) []bson.D {
	docs = slices.Clone(docs)
	sortStable(docs, srt, coll)
	return sortSkipLimitColl(docs, nil, skip, limit, nil)
}

// randomSortDoc draws a document whose sort fields tie often, are missing
// or null, hold arrays (empty too), mix types, or strings a collation
// orders apart from binary order.
func randomSortDoc(r *rand.Rand, i int) bson.D {
	d := bson.D{{Key: "_id", Value: int32(i)}}
	for _, f := range []string{"a", "b"} {
		switch r.IntN(9) {
		case 0: // missing
		case 1:
			d = append(d, bson.E{Key: f, Value: nil})
		case 2:
			d = append(d, bson.E{Key: f, Value: bson.A{int32(r.IntN(4)), int32(r.IntN(4))}})
		case 3:
			d = append(d, bson.E{Key: f, Value: bson.A{}})
		case 4:
			d = append(d, bson.E{Key: f, Value: []string{"x", "X", "y", "Y"}[r.IntN(4)]})
		case 5:
			d = append(d, bson.E{Key: f, Value: float64(r.IntN(4)) + 0.5})
		default:
			d = append(d, bson.E{Key: f, Value: int64(r.IntN(4))})
		}
	}
	return d
}

// TestSortFirstMatchesStableSort compares the bounded selection a find
// with a limit uses against a stable sort of every document, over random
// documents, sorts (ascending, descending, mixed, on one or two fields),
// skips, limits and with or without a collation.
func TestSortFirstMatchesStableSort(t *testing.T) {
	r := rand.New(rand.NewPCG(6, 43))
	caseless, err := bsonkit.ParseCollation(bson.D{{Key: "locale", Value: "en"}, {Key: "strength", Value: int32(2)}})
	if err != nil {
		t.Fatal(err)
	}
	sorts := []bson.D{
		{{Key: "a", Value: 1}},
		{{Key: "a", Value: -1}},
		{{Key: "a", Value: 1}, {Key: "b", Value: -1}},
		{{Key: "b", Value: -1}, {Key: "a", Value: -1}},
		{{Key: "a", Value: 1}, {Key: "_id", Value: -1}},
	}
	for round := range 400 {
		docs := make([]bson.D, r.IntN(60))
		for i := range docs {
			docs[i] = randomSortDoc(r, i)
		}
		spec := sorts[r.IntN(len(sorts))]
		srt, err := query.CompileSort(spec)
		if err != nil {
			t.Fatal(err)
		}
		var coll *bsonkit.Collation
		if r.IntN(3) == 0 {
			coll = caseless
		}
		skip, limit := int64(r.IntN(10)), int64(r.IntN(12))
		if r.IntN(4) == 0 {
			skip = 0
		}
		want := sortAllThenCut(docs, srt, skip, limit, coll)
		got := sortSkipLimitColl(slices.Clone(docs), srt, skip, limit, coll)
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("round %d: sort %v skip %d limit %d collation %v over %d documents:\n got  %v\n want %v",
				round, spec, skip, limit, coll != nil, len(docs), got, want)
		}
	}
}

// BenchmarkSortSkipLimit is a find's sort of 300,000 matches with a limit
// of 257 (a promotion loop's horizon read with that many events waiting).
func BenchmarkSortSkipLimit(b *testing.B) {
	docs := make([]bson.D, 300_000)
	for i := range docs {
		docs[i] = bson.D{{Key: "_id", Value: int64(i)}, {Key: "due", Value: int64((i * 7919) % len(docs))}, {Key: "seq", Value: int64(i)}}
	}
	srt, err := query.CompileSort(bson.D{{Key: "due", Value: 1}, {Key: "seq", Value: 1}, {Key: "_id", Value: 1}})
	if err != nil {
		b.Fatal(err)
	}
	in := make([]bson.D, len(docs))
	for b.Loop() {
		copy(in, docs)
		if got := sortSkipLimitColl(in, srt, 0, 257, nil); len(got) != 257 {
			b.Fatalf("got %d documents", len(got))
		}
	}
}

// TestFindSortLimitMatchesUnlimited runs finds shaped as a promotion
// loop's horizon read (equality on an index's leading fields, a sort on
// the rest, extra predicates the index does not hold, a partial index)
// with skips and limits, and checks each against the same find without a
// limit, cut by hand: the bounded selection and the full sort agree,
// ties, missing and null due times and descending sorts included.
func TestFindSortLimitMatchesUnlimited(t *testing.T) {
	_, client := setup(t)
	ctx := testCtx(t)
	c := client.Database("test").Collection("sched")
	_, err := c.Indexes().CreateMany(ctx, []mongo.IndexModel{
		{Keys: bson.D{{Key: "topic", Value: 1}, {Key: "partition", Value: 1}, {Key: "due", Value: 1}, {Key: "seq", Value: 1}}},
		{Keys: bson.D{{Key: "due", Value: -1}}, Options: options.Index().SetPartialFilterExpression(bson.D{{Key: "promoted", Value: false}})},
	})
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(43, 6))
	docs := make([]any, 400)
	for i := range docs {
		d := bson.D{{Key: "_id", Value: int32(i)}, {Key: "topic", Value: "orders"}, {Key: "partition", Value: int32(r.IntN(2))},
			{Key: "promoted", Value: r.IntN(4) == 0}, {Key: "seq", Value: int32(r.IntN(3))}}
		switch r.IntN(10) {
		case 0: // no due time
		case 1:
			d = append(d, bson.E{Key: "due", Value: nil})
		default:
			d = append(d, bson.E{Key: "due", Value: int64(r.IntN(50))})
		}
		docs[i] = d
	}
	if _, err := c.InsertMany(ctx, docs); err != nil {
		t.Fatal(err)
	}
	filters := []bson.D{
		{{Key: "topic", Value: "orders"}, {Key: "partition", Value: int32(1)}, {Key: "promoted", Value: false}},
		{{Key: "topic", Value: "orders"}, {Key: "partition", Value: int32(0)}},
		{{Key: "promoted", Value: false}},
	}
	sorts := []bson.D{
		{{Key: "due", Value: 1}, {Key: "seq", Value: 1}},
		{{Key: "due", Value: -1}, {Key: "seq", Value: -1}},
		{{Key: "due", Value: 1}},
		{{Key: "due", Value: -1}},
	}
	for _, f := range filters {
		for _, s := range sorts {
			all := findAll(t, c, f, options.Find().SetSort(s))
			for _, sl := range [][2]int64{{0, 1}, {0, 7}, {3, 5}, {20, 40}, {0, 500}, {190, 30}} {
				got := findAll(t, c, f, options.Find().SetSort(s).SetSkip(sl[0]).SetLimit(sl[1]))
				want := sortSkipLimitColl(all, nil, sl[0], sl[1], nil)
				if fmt.Sprint(got) != fmt.Sprint(want) {
					t.Fatalf("filter %v sort %v skip %d limit %d:\n got  %v\n want %v", f, s, sl[0], sl[1], got, want)
				}
			}
		}
	}
}

func findAll(t *testing.T, c *mongo.Collection, filter bson.D, opts *options.FindOptionsBuilder) []bson.D {
	t.Helper()
	ctx := testCtx(t)
	cur, err := c.Find(ctx, filter, opts)
	if err != nil {
		t.Fatal(err)
	}
	var out []bson.D
	if err := cur.All(ctx, &out); err != nil {
		t.Fatal(err)
	}
	return out
}
