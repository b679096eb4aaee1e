package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"testing"
	"testing/iotest"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/event-outbox/outbox/internal/apachekafka"
	"github.com/event-outbox/outbox/kafkax/kafkatest"
)

// TestBrokerFaultSchedule: the broker faults come from the seed; kills every
// two thirds to four thirds of -broker-kill-every, their kinds in turn;
// pauses outlast the session timeout and the broker's controller session;
// pauses and refusals each on a schedule of their own; none in the last
// fifth of the load.
func TestBrokerFaultSchedule(t *testing.T) {
	t.Parallel()
	const every = 45 * time.Second
	a := scheduleBrokerFaults(1, 10*time.Minute, every, 2*time.Minute, 3*time.Minute, 6*time.Second)
	require.Equal(t, a, scheduleBrokerFaults(1, 10*time.Minute, every, 2*time.Minute, 3*time.Minute, 6*time.Second))
	require.NotEqual(t, a, scheduleBrokerFaults(2, 10*time.Minute, every, 2*time.Minute, 3*time.Minute, 6*time.Second))
	var kills []action
	seen := map[actionKind]int{}
	for _, x := range a {
		seen[x.kind]++
		require.Less(t, x.at, 8*time.Minute, "%s in the last fifth", x)
		switch x.kind {
		case fBrokerKill, fBrokerKillPartLeader, fBrokerKillController:
			kills = append(kills, x)
			require.GreaterOrEqual(t, x.d, 2*time.Second)
			require.LessOrEqual(t, x.d, 10*time.Second)
		case fBrokerPause:
			require.Greater(t, x.d, 9*time.Second, "a pause must outlast the sessions")
		case fBrokerRefuse:
			require.Positive(t, x.d)
		default:
			t.Fatalf("not a broker fault: %s", x)
		}
	}
	for i := 1; i < len(kills); i++ {
		gap := kills[i].at - kills[i-1].at
		require.GreaterOrEqual(t, gap, every*2/3, "kills %s and %s", kills[i-1], kills[i])
		require.LessOrEqual(t, gap, every*4/3+time.Nanosecond, "kills %s and %s", kills[i-1], kills[i])
		require.NotEqual(t, kills[i-1].kind, kills[i].kind, "kinds in turn")
	}
	for _, k := range append(brokerKills, fBrokerPause, fBrokerRefuse) {
		require.Positive(t, seen[k], "%s never scheduled", k)
	}
	require.Empty(t, scheduleBrokerFaults(1, 10*time.Minute, 0, 0, 0, 6*time.Second), "0 disables them")
	// The short run (CI): one kill.
	short := scheduleBrokerFaults(1, 2*time.Minute, 90*time.Second, 0, 0, 6*time.Second)
	require.Len(t, short, 1)
	require.Equal(t, fBrokerKill, short[0].kind)
	// Refusals alone, every 60 s of a 2-minute run: one or two.
	ref := scheduleBrokerFaults(3, 2*time.Minute, 0, 0, time.Minute, 6*time.Second)
	require.NotEmpty(t, ref)
	for _, x := range ref {
		require.Equal(t, fBrokerRefuse, x.kind)
	}
}

// TestRestartCounter: the fetch watch's restarts and re-subscriptions are
// counted from the replicas' logs whatever the level the harness logs at,
// with the replica and partition; the rest passes through as before.
func TestRestartCounter(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	var notes []string
	rc := &restarts{note: func(m string) { notes = append(notes, m) }}
	inner := slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelError})
	l := slog.New(&restartCounter{inner: inner, rc: rc}).With("replica", "r1.2")
	l.Warn(msgFetchRestart, "partition", "t/3", "offset", 17)
	l.WithGroup("g").Warn(msgFetchResubscribe, "partition", "t/3")
	l.Warn("something else")
	l.Error("an error")
	require.Equal(t, 1, rc.restarts)
	require.Equal(t, 1, rc.resubs)
	require.Equal(t, []string{"fetch watch restart: replica=r1.2 partition=t/3 offset=17",
		"fetch watch re-subscription: replica=r1.2 partition=t/3"}, notes)
	require.NotContains(t, out.String(), "restarting", "Warn is below the inner handler's level")
	require.Contains(t, out.String(), "an error")
}

// TestKafkaFlags: -kafka takes kfake or apache, and apache starts its own
// cluster, so -kafka-brokers is refused beside it: exit code 2, no run.
func TestKafkaFlags(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"-kafka", "confluent"},
		{"-kafka", "apache", "-kafka-brokers", "127.0.0.1:9092"},
		{"-kafka", "apache", "-kafka-nodes", "0"},
	} {
		var out, errOut bytes.Buffer
		require.Equal(t, 2, run(context.Background(), args, &out, &errOut), "%v", args)
		require.Contains(t, errOut.String(), "-kafka", "%v", args)
		require.Empty(t, out.String())
	}
}

// TestApacheKillCadence: with -kafka apache, unless -kill-every or
// -replay-every are given, the schedule's abrupt replica kills (kills and
// offset-rewind replays) come on average at least two of the real
// broker's session timeouts (6 s) apart: a dead member keeps its
// partitions and holds every rebalance for a session timeout, so kfake's
// cadence kept the group rebalancing with dead members most of the time.
// On kfake, and for flags given, the cadence stays as asked.
func TestApacheKillCadence(t *testing.T) {
	t.Parallel()
	const session = 6 * time.Second
	meanGap := func(cfg config) time.Duration {
		const d = 10 * time.Minute
		kills := 0
		for _, a := range schedule(2, d, 3, cfg.killEvery, cfg.faultEvery, cfg.scenarioEvery, cfg.replayEvery, true, true) {
			if a.kind == actKill || a.kind == fOffsetRewind {
				kills++
			}
		}
		require.NotZero(t, kills)
		return d / time.Duration(kills)
	}
	kfakeDefaults := config{killEvery: 3 * time.Second, faultEvery: 500 * time.Millisecond, scenarioEvery: 5 * time.Second, replayEvery: 4 * time.Second}

	apache := kfakeDefaults
	apache.kafka = kafkaApache
	apache.spaceKillsForRealKafka(map[string]bool{})
	require.GreaterOrEqual(t, meanGap(apache), 2*session, "replica kills on a real broker")

	kfake := kfakeDefaults
	kfake.spaceKillsForRealKafka(map[string]bool{})
	require.Equal(t, kfakeDefaults, kfake, "kfake keeps its cadence")

	asked := kfakeDefaults
	asked.kafka = kafkaApache
	asked.spaceKillsForRealKafka(map[string]bool{"kill-every": true, "replay-every": true})
	require.Equal(t, 3*time.Second, asked.killEvery, "a cadence given on the command line is kept")
	require.Equal(t, 4*time.Second, asked.replayEvery)
}

// TestProduceWatch: the Produce responses of a connection are decoded from
// the bytes read, however they are split, and every partition refused for
// want of in-sync replicas is counted; other responses and other errors
// are not.
func TestProduceWatch(t *testing.T) {
	t.Parallel()
	for _, version := range []int16{7, 9, 11} { // before and after flexible versions
		f := kmsg.NewRequestFormatter(kmsg.FormatterClientID("t"))
		var out, in bytes.Buffer
		respond := func(id int32, body []byte, flexible bool) {
			head := binary.BigEndian.AppendUint32(nil, uint32(id))
			if flexible {
				head = append(head, 0) // no tagged field
			}
			in.Write(binary.BigEndian.AppendUint32(nil, uint32(len(head)+len(body))))
			in.Write(head)
			in.Write(body)
		}
		prod := kmsg.NewPtrProduceRequest()
		prod.Version, prod.Acks = version, -1
		out.Write(f.AppendRequest(nil, prod, 1))
		meta := kmsg.NewPtrMetadataRequest()
		meta.Version = 9
		out.Write(f.AppendRequest(nil, meta, 2))
		out.Write(f.AppendRequest(nil, prod, 3))

		resp := kmsg.NewPtrProduceResponse()
		resp.Version = version
		rt := kmsg.NewProduceResponseTopic()
		rt.Topic = "t"
		for _, code := range []int16{kerr.NotEnoughReplicas.Code, kerr.NotEnoughReplicasAfterAppend.Code, kerr.NotLeaderForPartition.Code, 0} {
			rp := kmsg.NewProduceResponseTopicPartition()
			rp.ErrorCode = code
			rt.Partitions = append(rt.Partitions, rp)
		}
		resp.Topics = append(resp.Topics, rt)
		respond(1, resp.AppendTo(nil), resp.IsFlexible())
		mresp := kmsg.NewPtrMetadataResponse()
		mresp.Version = 9
		respond(2, mresp.AppendTo(nil), true)
		resp.Topics[0].Partitions = resp.Topics[0].Partitions[:1]
		respond(3, resp.AppendTo(nil), resp.IsFlexible())

		w := &produceWatch{}
		conn := &fakeConn{r: iotest.OneByteReader(&in)}
		wc, err := w.dial(func(context.Context, string, string) (net.Conn, error) { return conn, nil })(context.Background(), "tcp", "x")
		require.NoError(t, err)
		// Requests written in pieces of 5 bytes.
		for b := out.Bytes(); len(b) > 0; {
			k := min(5, len(b))
			_, err := wc.Write(b[:k])
			require.NoError(t, err)
			b = b[k:]
		}
		_, err = io.Copy(io.Discard, wc)
		require.NoError(t, err)
		require.Equal(t, 3, w.count(), "version %d", version)
		require.Equal(t, out.Bytes(), conn.w.Bytes(), "the bytes pass unchanged")
	}
}

// fakeConn is a net.Conn reading from r and writing to w.
type fakeConn struct {
	net.Conn
	r io.Reader
	w bytes.Buffer
}

func (c *fakeConn) Read(p []byte) (int, error)  { return c.r.Read(p) }
func (c *fakeConn) Write(p []byte) (int, error) { return c.w.Write(p) }

// TestRefuseWritesApache: on a real three-node cluster (the harness's own
// settings), min.insync.replicas above the replication factor refuses
// nothing (Kafka 3.7 and later cap it at the replica count), while
// broker-refuse-writes (beginRefusal) makes every partition refuse an
// acks=all produce with NOT_ENOUGH_REPLICAS, which produceWatch counts;
// after end the same produces succeed again.
func TestRefuseWritesApache(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three JVMs")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var progress bytes.Buffer
	c, err := startApache(ctx, config{kafkaNodes: 3, progress: &progress})
	if errors.Is(err, apachekafka.ErrMissingTool) || errors.Is(err, apachekafka.ErrResolve) {
		if os.Getenv(kafkatest.EnvApacheRequired) != "" {
			t.Fatalf("real Apache Kafka required (%s is set): %v", kafkatest.EnvApacheRequired, err)
		}
		t.Skipf("real Apache Kafka unavailable: %v", err)
	}
	require.NoError(t, err, progress.String())
	t.Cleanup(func() { require.NoError(t, c.Stop()) })

	const topic = "refuse"
	const parts = 3
	w := &produceWatch{}
	d := net.Dialer{Timeout: time.Second}
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.Brokers()...), kgo.Dialer(w.dial(d.DialContext)),
		kgo.RequiredAcks(kgo.AllISRAcks()), kgo.DisableIdempotentWrite(), kgo.RecordRetries(0),
		kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.RecordDeliveryTimeout(15*time.Second))
	require.NoError(t, err)
	defer cl.Close()
	adm := kadm.NewClient(cl)
	_, err = adm.CreateTopic(ctx, parts, -1, nil, topic)
	require.NoError(t, err)
	produce := func(p int32) error {
		return cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Partition: p, Value: []byte("v")}).FirstErr()
	}
	// eventually polls produce on every partition until ok accepts its
	// error, for two minutes at most.
	eventually := func(what string, ok func(error) bool) {
		t.Helper()
		for p := range int32(parts) {
			deadline := time.Now().Add(2 * time.Minute)
			for {
				err := produce(p)
				if ok(err) {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("partition %d: %s: last produce: %v", p, what, err)
				}
				require.NoError(t, sleepCtx(ctx, 200*time.Millisecond))
			}
		}
	}
	accepted := func(err error) bool { return err == nil }
	refused := func(err error) bool {
		return errors.Is(err, kerr.NotEnoughReplicas) || errors.Is(err, kerr.NotEnoughReplicasAfterAppend)
	}
	eventually("accepted once the topic has leaders", accepted)

	// Above the replication factor: accepted, and nothing refused.
	above := "4"
	res, err := adm.AlterTopicConfigs(ctx, []kadm.AlterConfig{{Op: kadm.SetConfig, Name: "min.insync.replicas", Value: &above}}, topic)
	require.NoError(t, err)
	require.NoError(t, res[0].Err)
	for p := range int32(parts) {
		require.NoError(t, produce(p), "min.insync.replicas=4 with 3 replicas")
	}
	_, err = adm.AlterTopicConfigs(ctx, []kadm.AlterConfig{{Op: kadm.DeleteConfig, Name: "min.insync.replicas"}}, topic)
	require.NoError(t, err)
	require.Zero(t, w.count())

	r, err := beginRefusal(ctx, c, topic, 0)
	require.NoError(t, err)
	t.Logf("broker %d paused; every partition below min.insync.replicas=%d after %s", r.node.ID, r.rf, r.shrunk)
	eventually("refused with NOT_ENOUGH_REPLICAS during the fault", refused)
	require.Positive(t, w.count(), "the refusals are counted")
	require.NoError(t, r.end(ctx))
	require.False(t, r.node.Paused())
	eventually("accepted after the fault", accepted)
}
