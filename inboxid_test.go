package outbox

import (
	"encoding/json"
	"math/rand/v2"
	"strings"
	"testing"
	"testing/quick"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

func TestParseInboxID(t *testing.T) {
	t.Parallel()
	id, err := ParseInboxID("orders/OrderPlaced.v1/abc")
	require.NoError(t, err)
	require.Equal(t, InboxID{Topic: "orders", ContentSchema: "OrderPlaced.v1", IdempotencyKey: "abc"}, id)
	require.Equal(t, "orders/OrderPlaced.v1/abc", id.String(), "ordinary ids read as before")
	for _, bad := range []string{"", "orders", "orders/x", "orders/acme/OrderPlaced.v1/abc", "t/s/k%", "t/s%zz/k"} {
		_, err := ParseInboxID(bad)
		require.Error(t, err, bad)
	}
	_, err = ParseInboxID("orders/acme/OrderPlaced.v1/abc")
	require.ErrorContains(t, err, "%2F", "the error says how to write a slash")
}

// The reported collision: a key holding a slash and a schema holding one
// wrote the same string, so acting on one acted on the other.
func TestInboxIDsWithSlashesStayApart(t *testing.T) {
	t.Parallel()
	a := InboxID{Topic: "orders", ContentSchema: "OrderPlaced.v1/order", IdempotencyKey: "42"}
	b := InboxID{Topic: "orders", ContentSchema: "OrderPlaced.v1", IdempotencyKey: "order/42"}
	require.NotEqual(t, a.String(), b.String())
	require.Equal(t, "orders/OrderPlaced.v1/order%2F42", b.String())
	for _, id := range []InboxID{a, b} {
		back, err := ParseInboxID(id.String())
		require.NoError(t, err)
		require.Equal(t, id, back)
	}
}

// randomPart draws a string from an alphabet heavy in the characters an
// encoding can trip on: separators, escapes, controls, non-ASCII and bytes
// that are not UTF-8.
func randomPart(r *rand.Rand) string {
	alphabet := []string{"/", "%", "%2F", "%25", "2", "F", "f", "a", " ", "\t", "\n", "\x00", "\x7f", "é", "😀", "\xff", "\xc3", "+", "?", "#", "&", "=", `"`, "<"}
	var b strings.Builder
	for range r.IntN(8) {
		b.WriteString(alphabet[r.IntN(len(alphabet))])
	}
	return b.String()
}

// Property: every InboxID, whatever its parts hold, reads back the same
// from its string; the string has exactly two slashes, no control
// character and valid UTF-8 (so JSON and terminals carry it unchanged).
func TestInboxIDStringRoundTrips(t *testing.T) {
	t.Parallel()
	check := func(id InboxID) bool {
		s := id.String()
		back, err := ParseInboxID(s)
		if err != nil || back != id || strings.Count(s, "/") != 2 || !utf8.ValidString(s) {
			return false
		}
		for _, c := range []byte(s) {
			if c < 0x20 || c == 0x7f {
				return false
			}
		}
		j, err := json.Marshal(s)
		var viaJSON string
		return err == nil && json.Unmarshal(j, &viaJSON) == nil && viaJSON == s
	}
	require.NoError(t, quick.Check(func(topic, schema, key string) bool {
		return check(InboxID{Topic: topic, ContentSchema: schema, IdempotencyKey: key})
	}, &quick.Config{MaxCount: 2000}))
	r := rand.New(rand.NewPCG(1, 2))
	seen := map[string]InboxID{}
	for range 20000 {
		id := InboxID{Topic: randomPart(r), ContentSchema: randomPart(r), IdempotencyKey: randomPart(r)}
		require.True(t, check(id), "%q", id)
		if other, ok := seen[id.String()]; ok {
			require.Equal(t, other, id, "two ids share the string %q", id.String())
		}
		seen[id.String()] = id
	}
}
