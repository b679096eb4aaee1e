package claimcheck

import (
	"bytes"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
	"go.mongodb.org/mongo-driver/v2/bson"
)

func TestRefRoundTrip(t *testing.T) {
	id := bson.NewObjectID()
	got, err := ParseRef(Ref(id))
	if err != nil || got != id {
		t.Fatalf("ParseRef(Ref(%s)) = %s, %v", id.Hex(), got.Hex(), err)
	}
	for _, bad := range []string{"", "outbox-payload:", "outbox-payload:xyz", "http://x/" + id.Hex(), id.Hex()} {
		if _, err := ParseRef(bad); err == nil {
			t.Errorf("ParseRef(%q) accepted", bad)
		}
	}
}

func TestAddRefAndRefOf(t *testing.T) {
	for _, ce := range []bool{false, true} {
		rec := &kgo.Record{}
		if _, ok := RefOf(rec); ok {
			t.Fatal("a record without the header has a reference")
		}
		AddRef(rec, ce, "outbox-payload:00")
		want := HeaderNative
		if ce {
			want = HeaderCloudEvents
		}
		if len(rec.Headers) != 1 || rec.Headers[0].Key != want {
			t.Fatalf("cloudEvents %v: headers %v, want %s", ce, rec.Headers, want)
		}
		if ref, ok := RefOf(rec); !ok || ref != "outbox-payload:00" {
			t.Fatalf("RefOf = %q, %v", ref, ok)
		}
	}
}

func TestChunksCoverThePayloadInOrder(t *testing.T) {
	ref := bson.NewObjectID()
	for _, size := range []int{0, 1, ChunkSize - 1, ChunkSize, ChunkSize + 1, 2*ChunkSize + 5} {
		payload := bytes.Repeat([]byte{'x'}, size)
		chunks := Chunks(ref, payload)
		want := max(1, (size+ChunkSize-1)/ChunkSize)
		if len(chunks) != want {
			t.Fatalf("size %d: %d chunks, want %d", size, len(chunks), want)
		}
		var joined []byte
		for n, c := range chunks {
			ch := c.(*Chunk)
			if ch.Ref != ref || int(ch.N) != n || int(ch.Count) != want || ch.Size != int64(size) || ch.Published || len(ch.Data) > ChunkSize {
				t.Fatalf("size %d: chunk %d is %+v", size, n, ch)
			}
			joined = append(joined, ch.Data...)
		}
		if !bytes.Equal(joined, payload) {
			t.Fatalf("size %d: chunks join to %d bytes", size, len(joined))
		}
	}
}
