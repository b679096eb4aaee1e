package bsonkit

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
)

func TestNestedDocumentIsBSON(t *testing.T) {
	t.Parallel()
	for _, n := range []int{0, 1, 5} {
		require.NoError(t, bson.Raw(NestedDocument(n)).Validate(), n)
	}
	var d bson.D
	require.NoError(t, bson.Unmarshal(NestedDocument(2), &d))
	require.Equal(t, bson.D{{Key: "", Value: bson.D{{Key: "", Value: bson.D{}}}}}, d)
}

// mongod accepts 200 levels below the top-level document (maxBSONDepth) and
// refuses one more; code with scope counts two levels.
func TestCheckDepthLimit(t *testing.T) {
	t.Parallel()
	require.NoError(t, CheckDepth(NestedDocument(MaxWireDepth), MaxWireDepth))
	var de *DepthError
	require.ErrorAs(t, CheckDepth(NestedDocument(MaxWireDepth+1), MaxWireDepth), &de)
	require.Equal(t, MaxWireDepth, de.Limit)
	require.ErrorContains(t, de, "exceeds maximum nested object depth")

	arr := func(levels int) bson.D {
		var v any = int32(1)
		for range levels {
			v = bson.A{v}
		}
		return bson.D{{Key: "a", Value: v}}
	}
	require.NoError(t, CheckDepth(mustMarshal(arr(3)), 3))
	require.ErrorAs(t, CheckDepth(mustMarshal(arr(4)), 3), &de)

	cws := bson.D{{Key: "c", Value: bson.CodeWithScope{Code: "x", Scope: bson.D{{Key: "s", Value: bson.D{}}}}}}
	require.NoError(t, CheckDepth(mustMarshal(cws), 3))
	require.ErrorAs(t, CheckDepth(mustMarshal(cws), 2), &de)
}

// Two million levels (the attack that overflowed the server's stack) are
// refused at level 201, reading 1.4 kB of the 14 MB.
func TestCheckDepthStopsEarly(t *testing.T) {
	t.Parallel()
	b := NestedDocument(2_000_000)
	var de *DepthError
	require.ErrorAs(t, CheckDepth(b, MaxWireDepth), &de)
	// Break the document after level 300: still refused for its depth,
	// which CheckDepth meets first.
	b[7*300] = 0x7e
	require.ErrorAs(t, CheckDepth(b, MaxWireDepth), &de)
}

// Every valid document is accepted with a limit above its depth, whatever
// its types; truncated or altered bytes are errors, never a panic.
func TestCheckDepthAcceptsValidBSON(t *testing.T) {
	t.Parallel()
	docs := codecSamples()
	r := rand.New(rand.NewPCG(3, 4))
	for range 300 {
		docs = append(docs, randomDoc(r, 4))
	}
	for i, d := range docs {
		raw := mustMarshal(d)
		require.NoError(t, CheckDepth(raw, 10), "doc %d: %v", i, d)
		for cut := range len(raw) {
			require.Error(t, CheckDepth(raw[:cut], 10), "doc %d cut at %d", i, cut)
		}
	}
	require.Error(t, CheckDepth(append(mustMarshal(bson.D{}), 0), 10), "trailing byte")
}

// FuzzCheckDepth: no input panics, and every document the driver decodes
// (that spans its bytes) is accepted with a limit above any depth the input could hold.
func FuzzCheckDepth(f *testing.F) {
	for _, d := range codecSamples() {
		f.Add(mustMarshal(d))
	}
	f.Add(NestedDocument(MaxWireDepth + 1))
	f.Add(NestedDocument(3)[:10])
	f.Fuzz(func(t *testing.T, b []byte) {
		err := CheckDepth(b, len(b))
		if err == nil && len(b) > 0 {
			require.NoError(t, CheckDepth(b, len(b)/5+1), "a level costs at least 5 bytes")
		}
		var d bson.D
		if bson.Unmarshal(b, &d) == nil && len(b) == int(int32(binary.LittleEndian.Uint32(b))) {
			require.NoError(t, err)
		}
	})
}

// BenchmarkCheckDepth: the pass every incoming document now takes before
// it is validated and decoded, on a typical insert command and on the
// 14 MB attack (refused at level 201).
func BenchmarkCheckDepth(b *testing.B) {
	cmd := mustMarshal(codecSamples()[2])
	attack := NestedDocument(2_000_000)
	b.Run("insert", func(b *testing.B) {
		b.SetBytes(int64(len(cmd)))
		for b.Loop() {
			if err := CheckDepth(cmd, MaxWireDepth); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("decode-insert", func(b *testing.B) {
		var d Decoder
		for b.Loop() {
			if _, err := d.Decode(cmd); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("attack", func(b *testing.B) {
		for b.Loop() {
			if CheckDepth(attack, MaxWireDepth) == nil {
				b.Fatal("accepted")
			}
		}
	})
}
