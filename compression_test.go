package outbox

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestPublisherCompression: the publisher sends gzip batches by default
// (every mainstream client reads them; franz-go's own default, snappy,
// kafkajs and kafka-python without python-snappy cannot), and
// Config.Compression chooses another codec.
func TestPublisherCompression(t *testing.T) {
	for _, tc := range []struct {
		name  string
		codec Compression
		attr  uint8 // Kafka's attribute: 0 none, 1 gzip, 2 snappy
	}{
		{"default", "", 1},
		{"none", CompressionNone, 0},
		{"snappy", CompressionSnappy, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := setup(t)
			cfg := b.config("codec")
			cfg.Compression = tc.codec
			c := b.client(t, cfg)
			start(t, c)
			ctx := context.Background()
			require.NoError(t, c.Transact(ctx, func(ctx context.Context) error {
				// Large enough to compress (kgo sends a batch that does
				// not shrink uncompressed).
				return Record(ctx, orderPlaced{Run: b.run, OrderID: strings.Repeat("order-1 ", 60), Amount: 1})
			}))
			cl := b.kafka.Client(t, kgo.ConsumeTopics(b.kafkaTopic(ordersTopic)), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
			pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			var rec *kgo.Record
			for rec == nil && pctx.Err() == nil {
				fs := cl.PollFetches(pctx)
				fs.EachRecord(func(r *kgo.Record) { rec = r })
			}
			require.NotNil(t, rec, "the event was published")
			require.Equal(t, tc.attr, rec.Attrs.CompressionType())
		})
	}
}

// TestCompressionRefusesUnknownCodec: a codec Kafka does not have is a
// configuration error naming the field and the valid values.
func TestCompressionRefusesUnknownCodec(t *testing.T) {
	b := setup(t)
	cfg := b.config("codec")
	cfg.Compression = "brotli"
	_, err := New(cfg)
	require.ErrorIs(t, err, ErrConfig)
	require.ErrorContains(t, err, `Compression unknown codec "brotli" (gzip, none, snappy, lz4 or zstd)`)
}

// TestDocsNameTheDefaultCodec: wherever the docs or the code's comments
// say which codec is used by default, they name Config's default.
func TestDocsNameTheDefaultCodec(t *testing.T) {
	t.Parallel()
	def := string(Config{}.withDefaults().Compression)
	claim := regexp.MustCompile(`(?i)\b(snappy|lz4|zstd|gzip)\b[^.;\n]{0,40}\bby default\b|\b(snappy|lz4|zstd|gzip) unless\b`)
	files, err := filepath.Glob("docs/*.md")
	require.NoError(t, err)
	gos, err := filepath.Glob("*.go")
	require.NoError(t, err)
	files = append(append(files, "README.md"), gos...)
	claims := 0
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		b, err := os.ReadFile(name)
		require.NoError(t, err)
		for _, m := range claim.FindAllStringSubmatch(string(b), -1) {
			claims++
			require.Equal(t, def, strings.ToLower(m[1]+m[2]), "%s: %q", name, m[0])
		}
	}
	require.NotZero(t, claims, "the pattern finds the docs' claims")
}
