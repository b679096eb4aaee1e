package outbox

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kversion"

	"github.com/event-outbox/outbox/kafkax/kafkatest"
)

// kip848Settings give the embedded cluster's KIP-848 groups the session
// timeout and heartbeat interval that bundle.config gives classic groups
// (6 s, 200 ms): the broker decides them under GroupConsumer.
var kip848Settings = []kfake.Opt{kfake.BrokerConfigs(map[string]string{
	"group.consumer.session.timeout.ms":    "6000",
	"group.consumer.heartbeat.interval.ms": "200",
})}

// groupProtocols holds the protocol of the tests forEachGroupProtocol runs,
// by *testing.T; setup reads it.
var groupProtocols sync.Map

// forEachGroupProtocol runs f as two subtests, "classic" and "consumer",
// whose setup bundles configure both groups with that Config.GroupProtocol.
func forEachGroupProtocol(t *testing.T, f func(t *testing.T)) {
	t.Helper()
	for _, p := range []GroupProtocol{GroupClassic, GroupConsumer} {
		t.Run(p.String(), func(t *testing.T) {
			groupProtocols.Store(t, p)
			t.Cleanup(func() { groupProtocols.Delete(t) })
			f(t)
		})
	}
}

// groupProtocolOf returns the protocol forEachGroupProtocol gave t, or
// else the one OUTBOX_TEST_GROUP_PROTOCOL names (GroupClassic when unset),
// failing t on a name that is no protocol.
func groupProtocolOf(t *testing.T) GroupProtocol {
	t.Helper()
	if p, ok := groupProtocols.Load(t); ok {
		return p.(GroupProtocol)
	}
	var p GroupProtocol
	if err := p.UnmarshalText([]byte(kafkatest.GroupProtocolName())); err != nil {
		t.Fatalf("%s: %v", kafkatest.EnvGroupProtocol, err)
	}
	return p
}

// The doctor names the protocol in use and the brokers' support for
// KIP-848 (kfake serves it).
func TestDoctorReportsGroupProtocol(t *testing.T) {
	t.Parallel()
	forEachGroupProtocol(t, func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		c := b.client(t, b.config("doctor"))
		r, err := c.Doctor(context.Background())
		require.NoError(t, err)
		fs, sev := findingsOf(r, "kafka.group_protocol")
		require.Len(t, fs, 1, dump(r))
		require.Equal(t, SeverityNote, sev)
		require.Contains(t, fs[0].Read, "Config.GroupProtocol "+b.protocol.String())
		require.Contains(t, fs[0].Read, "serve ConsumerGroupHeartbeat v1")
		if b.protocol == GroupConsumer && !b.kafka.Real {
			require.Contains(t, fs[0].Read, "group.consumer.session.timeout.ms is 6s")
		}
	})
}

// Against brokers without KIP-848 (Kafka 3.9's API versions), GroupConsumer
// falls back to the classic protocol: the publisher's lease is then
// renewed by the classic probe, events are published and handled, and the
// doctor says the groups do not run the protocol asked for.
func TestGroupConsumerFallsBackToClassic(t *testing.T) {
	t.Parallel()
	if len(kafkatest.EnvSeeds()) > 0 {
		t.Skip("needs the embedded kfake cluster capped at Kafka 3.9's API versions")
	}
	b := setupWith(t, []kafkatest.Option{kafkatest.ClusterOptions(kfake.MaxVersions(kversion.V3_9_0()))})
	cfg := pubConfig(b)
	cfg.GroupProtocol = GroupConsumer
	c := b.client(t, cfg)
	r := newRecorder(b, c)
	runPub(t, c, publisherOptions{})
	r.record(t, keysN(6)...)
	eventually(t, "published through the classic fallback", func() bool { return b.published(t, cfg) == 6 })
	require.True(t, c.publisherStatus().LeaseValid)

	rep, err := c.Doctor(context.Background())
	require.NoError(t, err)
	fs, sev := findingsOf(rep, "kafka.group_protocol")
	require.Len(t, fs, 1, dump(rep))
	require.Equal(t, SeverityRisk, sev)
	require.Contains(t, fs[0].Read, "no broker serves ConsumerGroupHeartbeat v1")
	require.Contains(t, fs[0].Problem, "falls back to the classic protocol")
}

// GroupProtocol reads and writes its String form (the chaos harness's
// -group-protocol flag, OUTBOX_TEST_GROUP_PROTOCOL) and refuses any other.
func TestGroupProtocolText(t *testing.T) {
	t.Parallel()
	for _, p := range []GroupProtocol{GroupClassic, GroupConsumer} {
		b, err := p.MarshalText()
		require.NoError(t, err)
		var got GroupProtocol
		require.NoError(t, got.UnmarshalText(b))
		require.Equal(t, p, got)
	}
	got := GroupConsumer
	require.EqualError(t, got.UnmarshalText([]byte("Consumer")), `outbox: unknown group protocol "Consumer" (want classic or consumer)`)
	require.Equal(t, GroupConsumer, got, "a refused name leaves the value")
}

// OUTBOX_TEST_GROUP_PROTOCOL sets the protocol of the tests' configs,
// except in the tests that run each protocol themselves.
func TestGroupProtocolFromEnv(t *testing.T) {
	t.Setenv(kafkatest.EnvGroupProtocol, " consumer ")
	require.Equal(t, GroupConsumer, groupProtocolOf(t))
	t.Setenv(kafkatest.EnvGroupProtocol, "")
	require.Equal(t, GroupClassic, groupProtocolOf(t))
	forEachGroupProtocol(t, func(t *testing.T) {
		t.Setenv(kafkatest.EnvGroupProtocol, "consumer")
		require.Equal(t, t.Name() == "TestGroupProtocolFromEnv/consumer", groupProtocolOf(t) == GroupConsumer)
	})
}
