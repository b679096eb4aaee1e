package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/event-outbox/outbox"
)

// A consumer no one here wrote, without a snappy codec, reads every record
// of the example in each wire format: kafkajs (npm), which decodes gzip and
// uncompressed batches and fails on snappy ones ("KafkaJSNotImplemented:
// Snappy compression not implemented") unless a codec plugin is added.
//
// kafkajs is looked up in $OUTBOX_KAFKAJS_DIR, else in
// ~/.cache/outbox-kafkajs (each a directory holding node_modules/kafkajs);
// .ci/run installs it there: npm install --prefix ~/.cache/outbox-kafkajs
// kafkajs@2.2.4. Without node or kafkajs the test skips, saying so.

// kafkajsScript reads topics from the start with a new group until it has
// want records, then prints them as JSON; a consumer crash (a codec it
// lacks) exits 1 with the error.
const kafkajsScript = `
const { Kafka, logLevel } = require("kafkajs");
const [brokers, topics, want] = [process.argv[1], process.argv[2].split(","), Number(process.argv[3])];
const kafka = new Kafka({ clientId: "nosnappy-test", brokers: brokers.split(","), logLevel: logLevel.ERROR });
const consumer = kafka.consumer({ groupId: "nosnappy-" + process.pid + "-" + Date.now() });
const out = [];
const fail = (e) => { console.error(String(e && e.stack || e)); process.exit(1); };
consumer.on(consumer.events.CRASH, (e) => fail(e.payload.error));
setTimeout(() => fail("read " + out.length + " of " + want + " records in 60 s: " + JSON.stringify(out.map((r) => r.topic + "/" + r.partition + "@" + r.offset))), 60000);
(async () => {
  await consumer.connect();
  for (const topic of topics) await consumer.subscribe({ topic, fromBeginning: true });
  await consumer.run({ eachMessage: async ({ topic, partition, message }) => {
    const headers = {};
    for (const [k, v] of Object.entries(message.headers || {})) headers[k] = String(v);
    out.push({ topic, partition, offset: message.offset, value: message.value.toString(), headers });
    if (out.length >= want) {
      // Not consumer.disconnect(): it waits for this very handler.
      process.stdout.write(JSON.stringify({ version: require("kafkajs/package.json").version, records: out }), () => process.exit(0));
    }
  } });
})().catch(fail);
`

// kafkajsDir returns the directory whose node_modules holds kafkajs, or
// skips the test.
func kafkajsDir(t *testing.T) (node, dir string) {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("skipped: node is not installed (Debian: apt-get install nodejs npm), so kafkajs cannot run")
	}
	home, _ := os.UserHomeDir()
	for _, d := range []string{os.Getenv("OUTBOX_KAFKAJS_DIR"), filepath.Join(home, ".cache", "outbox-kafkajs")} {
		if d == "" {
			continue
		}
		if _, err := os.Stat(filepath.Join(d, "node_modules", "kafkajs", "package.json")); err == nil {
			return node, d
		}
	}
	t.Skip("skipped: kafkajs is not installed; install it with: npm install --prefix ~/.cache/outbox-kafkajs kafkajs@2.2.4 (or set OUTBOX_KAFKAJS_DIR)")
	return "", ""
}

type kafkajsRecord struct {
	Topic   string            `json:"topic"`
	Value   string            `json:"value"`
	Headers map[string]string `json:"headers"`
}

func TestClientWithoutSnappyReadsEveryRecord(t *testing.T) {
	t.Parallel()
	node, dir := kafkajsDir(t)
	for _, format := range []outbox.Format{outbox.FormatNative, outbox.FormatEventOutbox, outbox.FormatCloudEvents} {
		t.Run(format.String(), func(t *testing.T) {
			t.Parallel()
			s := setupFormat(t, 1, format)
			r := s.replicas[0]
			var ids []string
			for i := range 12 {
				amount := 10 + i
				if i%4 == 3 {
					amount = creditLimit + 1
				}
				ids = append(ids, r.createOrder(t, fmt.Sprintf("customer-%d", i), amount))
			}
			for _, id := range ids {
				r.waitSettled(t, id)
			}
			r.waitDrained(t)

			// Every record of both topics, and the codecs of their batches.
			adm, err := kadm.NewOptClient(kgo.SeedBrokers(s.stack.brokers...))
			require.NoError(t, err)
			defer adm.Close()
			ends, err := adm.ListEndOffsets(t.Context(), ordersTopic, paymentsTopic)
			require.NoError(t, err)
			want := int64(0)
			ends.Each(func(o kadm.ListedOffset) { want += o.Offset })
			require.Positive(t, want)
			codecs := batchCodecs(t, s.stack.brokers, int(want))

			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, node, "-e", kafkajsScript, strings.Join(s.stack.brokers, ","), ordersTopic+","+paymentsTopic, fmt.Sprint(want))
			cmd.Env = append(os.Environ(), "NODE_PATH="+filepath.Join(dir, "node_modules"))
			var stderr strings.Builder
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			require.NoError(t, err, "kafkajs failed (batch codecs %v): %s", codecs, stderr.String())
			var got struct {
				Version string          `json:"version"`
				Records []kafkajsRecord `json:"records"`
			}
			require.NoError(t, json.Unmarshal(out, &got))
			require.Len(t, got.Records, int(want))
			t.Logf("kafkajs %s read %d records; batch codecs %v", got.Version, len(got.Records), codecs)
			for _, rec := range got.Records {
				var body map[string]any
				require.NoError(t, json.Unmarshal([]byte(rec.Value), &body), rec.Value)
				if rec.Topic != paymentsTopic {
					require.Equal(t, "1", rec.Headers["outbox-version"])
					continue
				}
				switch format {
				case outbox.FormatNative:
					require.Equal(t, "1", rec.Headers["outbox-version"])
				case outbox.FormatEventOutbox:
					require.Equal(t, "event-outbox", rec.Headers["outbox-format"])
					require.NotEmpty(t, body["idempotency_key"])
				case outbox.FormatCloudEvents:
					require.Equal(t, "1.0", rec.Headers["ce_specversion"])
				}
			}
		})
	}
}

// batchCodecs reads the want records of both topics with franz-go and
// counts the codecs of their batches ("none", "gzip", "snappy"...), for the
// failure message and the log.
func batchCodecs(t *testing.T, brokers []string, want int) map[string]int {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(ordersTopic, paymentsTopic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	require.NoError(t, err)
	defer cl.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	names := []string{"none", "gzip", "snappy", "lz4", "zstd"}
	out, n := map[string]int{}, 0
	for n < want {
		fs := cl.PollFetches(ctx)
		require.NoError(t, ctx.Err(), "read %d of %d records", n, want)
		fs.EachRecord(func(r *kgo.Record) {
			n++
			out[names[min(int(r.Attrs.CompressionType()), len(names)-1)]]++
		})
	}
	return out
}
