package outbox

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseInboxID(t *testing.T) {
	t.Parallel()
	id, err := ParseInboxID("orders/acme/OrderPlaced.v1/abc")
	require.NoError(t, err)
	require.Equal(t, InboxID{Topic: "orders", ContentSchema: "acme/OrderPlaced.v1", IdempotencyKey: "abc"}, id)
	back, err := ParseInboxID(id.String())
	require.NoError(t, err)
	require.Equal(t, id, back)
	for _, bad := range []string{"", "orders", "orders/x", "/s/k", "t//k", "t/s/"} {
		_, err := ParseInboxID(bad)
		require.Error(t, err, bad)
	}
}
