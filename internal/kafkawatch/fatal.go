package kafkawatch

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

// FatalHook turns fatal group errors into the cancellation cause of Run's
// goroutine group. Each Kafka group client the framework creates carries it.
type FatalHook struct {
	// Group is the group's name, named in the error.
	Group string
	// Stop cancels Run with the error.
	Stop context.CancelCauseFunc
	// Kind is the error every error given to Stop wraps (the root's
	// ErrKafkaGroup), so that callers match it with errors.Is.
	Kind error
	// ConsumerProtocol is set when the group asks for KIP-848
	// (Config.GroupConsumer): there GROUP_ID_NOT_FOUND, which a classic
	// group's coordinator may answer in passing, is fatal too.
	ConsumerProtocol bool
}

var _ kgo.HookGroupManageError = (*FatalHook)(nil)

// OnGroupManageError implements kgo.HookGroupManageError.
func (h *FatalHook) OnGroupManageError(err error) {
	if h.ConsumerProtocol && errors.Is(err, kerr.GroupIDNotFound) {
		h.Stop(fmt.Errorf("%w: group %q: %w: %s", h.Kind, h.Group, err, classicGroupHint))
		return
	}
	for _, fatal := range fatalGroupErrors {
		if errors.Is(err, fatal) {
			if errors.Is(err, kerr.InconsistentGroupProtocol) {
				err = fmt.Errorf("%w: %s", err, groupProtocolHint)
			}
			h.Stop(fmt.Errorf("%w: group %q: %w", h.Kind, h.Group, err))
			return
		}
	}
}
