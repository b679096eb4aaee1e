package kafkax

import (
	"strconv"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// BenchmarkPartition measures the partition choice done for every recorded
// event.
func BenchmarkPartition(b *testing.B) {
	key := []byte("order-123456")
	b.ReportAllocs()
	for b.Loop() {
		Partition(key, 12)
	}
}

// TestPartitionConcurrent checks that the shared partitioner gives the same
// answers from many goroutines (run with -race).
func TestPartitionConcurrent(t *testing.T) {
	t.Parallel()
	want := make([]int32, 1000)
	for i := range want {
		want[i] = Partition([]byte(strconv.Itoa(i)), 7)
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for i := range want {
				if got := Partition([]byte(strconv.Itoa(i)), 7); got != want[i] {
					t.Errorf("key %d: partition %d, want %d", i, got, want[i])
				}
			}
		})
	}
	wg.Wait()
	require.Less(t, Partition(nil, 3), int32(3))
}
