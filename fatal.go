package outbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// fatalGroupErrors are group errors that retrying cannot fix: the
// configuration or the permissions are wrong. Run stops and returns them
// instead of retrying forever.
var fatalGroupErrors = []error{
	kerr.InvalidSessionTimeout,
	kerr.InvalidGroupID,
	kerr.GroupAuthorizationFailed,
	kerr.TopicAuthorizationFailed,
	kerr.SaslAuthenticationFailed,
	kerr.GroupMaxSizeReached,
	// The group's members share no assignor: another client holds the
	// group (a Python event-outbox service's aiokafka offers "roundrobin",
	// the framework "cooperative-sticky"). The broker refuses the joiner
	// until those members leave, which can take forever: a joiner that
	// retried would stall without consuming anything.
	kerr.InconsistentGroupProtocol,
}

// groupProtocolHint explains INCONSISTENT_GROUP_PROTOCOL: a mixed group of
// this framework and another client is not supported (see
// docs/wire-formats.md, "Migrating a Python event-outbox service in place").
const groupProtocolHint = "the group's current members use another client whose assignors this framework does not share " +
	"(for example a Python event-outbox service: aiokafka offers \"roundrobin\", this framework \"cooperative-sticky\"); " +
	"a group mixing them is refused: stop every member of the other client, then start this service " +
	"(docs/wire-formats.md, migrating a Python event-outbox service in place)"

// classicGroupHint explains GROUP_ID_NOT_FOUND answered to a KIP-848
// heartbeat: the group exists as a classic group with members (another
// client, such as a Python event-outbox service, or replicas still on
// GroupClassic) and the broker does not convert it (kfake never does; Kafka
// only under group.consumer.migration.policy and its conditions). The
// broker keeps refusing the joiner while those members stay: a joiner that
// retried would stall without consuming anything, as under
// INCONSISTENT_GROUP_PROTOCOL.
const classicGroupHint = "under Config.GroupProtocol GroupConsumer (KIP-848) the broker refuses to join a group that classic-protocol members hold " +
	"(another client, for example a Python event-outbox service, or replicas still running GroupClassic) and does not convert: " +
	"stop those members, or run every replica with the same GroupProtocol (docs/guarantees.md)"

// fatalHook turns fatal group errors into the cancellation cause of Run's
// goroutine group. Each Kafka group client the framework creates carries it.
type fatalHook struct {
	group string
	stop  context.CancelCauseFunc
	// consumerProtocol is set when the group asks for KIP-848
	// (Config.GroupConsumer): there GROUP_ID_NOT_FOUND, which a classic
	// group's coordinator may answer in passing, is fatal too.
	consumerProtocol bool
}

var _ kgo.HookGroupManageError = (*fatalHook)(nil)

// OnGroupManageError implements kgo.HookGroupManageError.
func (h *fatalHook) OnGroupManageError(err error) {
	if h.consumerProtocol && errors.Is(err, kerr.GroupIDNotFound) {
		h.stop(fmt.Errorf("%w: group %q: %w: %s", ErrKafkaGroup, h.group, err, classicGroupHint))
		return
	}
	for _, fatal := range fatalGroupErrors {
		if errors.Is(err, fatal) {
			if errors.Is(err, kerr.InconsistentGroupProtocol) {
				err = fmt.Errorf("%w: %s", err, groupProtocolHint)
			}
			h.stop(fmt.Errorf("%w: group %q: %w", ErrKafkaGroup, h.group, err))
			return
		}
	}
}

// groupHook returns the fatal-error hook for one of the framework's group
// clients, or a no-op hook when the client is not running under Run.
func (c *Client) groupHook(group string) kgo.Opt {
	stop := c.stopRun
	if stop == nil {
		stop = func(error) {}
	}
	return kgo.WithHooks(&fatalHook{group: group, stop: stop, consumerProtocol: c.cfg.GroupProtocol == GroupConsumer})
}
