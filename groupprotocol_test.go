package outbox

import (
	"sync"
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"
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
// GroupClassic.
func groupProtocolOf(t *testing.T) GroupProtocol {
	if p, ok := groupProtocols.Load(t); ok {
		return p.(GroupProtocol)
	}
	return GroupClassic
}
