package kafkax

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// Vectors from Kafka's own partitioner tests (murmur2 with seed 0x9747b28c,
// made positive with & 0x7fffffff).
func TestPartitionMatchesKafka(t *testing.T) {
	t.Parallel()
	cases := []struct {
		key  string
		hash int32
	}{
		{"21", -973932308},
		{"foobar", -790332482},
		{"a-little-bit-long-string", -985981536},
		{"a-little-bit-longer-string", -1486304829},
		{"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971},
		{"abc", 479470107},
	}
	for _, c := range cases {
		positive := int64(uint32(c.hash) & 0x7fffffff)
		for _, n := range []int{1, 3, 6, 12, 100} {
			require.Equal(t, int32(positive%int64(n)), Partition([]byte(c.key), n), "key %q n %d", c.key, n)
		}
	}
	require.Equal(t, int32(0), Partition([]byte("x"), 0))
}
