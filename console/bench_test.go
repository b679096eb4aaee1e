package console

import (
	"fmt"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/event-outbox/outbox"
)

// BenchmarkPages100kParked renders the pages that read parked events with
// 100,000 of them in the inbox (1,000 heads each holding 99 events), on the
// embedded MongoDB server:
//
//	go test -run '^$' -bench Pages100kParked -benchtime 5x ./console
func BenchmarkPages100kParked(b *testing.B) {
	bd := setup(b, true)
	now := time.Now().UTC().Add(-time.Hour)
	const heads, perHead = 1000, 100
	batch := make([]bson.D, 0, 10_000)
	for h := range heads {
		head := outbox.InboxID{Topic: ordersTopic, ContentSchema: "OrderPlaced.v1", IdempotencyKey: fmt.Sprintf("head-%04d", h)}
		for i := range perHead {
			var by *outbox.InboxID
			key := head.IdempotencyKey
			if i > 0 {
				by, key = &head, fmt.Sprintf("%s-held-%02d", head.IdempotencyKey, i)
			}
			batch = append(batch, parkDoc(key, fmt.Sprintf("o-%04d", h), now.Add(time.Duration(h*perHead+i)*time.Millisecond), by))
			if len(batch) == cap(batch) {
				insert(b, bd.inbox(), batch...)
				batch = batch[:0]
			}
		}
	}
	require.Equal(b, int64(heads*perHead), count(b, bd.inbox(), bson.D{{Key: "parked", Value: true}}))
	cl := jarClient(b)
	for _, p := range []string{"", "parked", "parked?view=held", "parked?key=o-0500", "parked?page=999",
		"event?id=" + url.QueryEscape("orders/OrderPlaced.v1/head-0500")} {
		b.Run(fmt.Sprintf("page=%q", p), func(b *testing.B) {
			for b.Loop() {
				code, body := get(b, cl, bd.url(p))
				if code != http.StatusOK {
					b.Fatalf("%s: %d %s", p, code, body)
				}
			}
		})
	}
}
