package outbox

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestNewIdempotencyKey(t *testing.T) {
	t.Parallel()
	a, b := NewIdempotencyKey(), NewIdempotencyKey()
	require.Len(t, a, 32)
	require.NotEqual(t, a, b)
	require.Equal(t, byte('4'), a[12]) // version nibble
}
