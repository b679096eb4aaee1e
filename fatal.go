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

// fatalHook turns fatal group errors into the cancellation cause of Run's
// goroutine group. Each Kafka group client the framework creates carries it.
type fatalHook struct {
	group string
	stop  context.CancelCauseFunc
}

var _ kgo.HookGroupManageError = (*fatalHook)(nil)

// OnGroupManageError implements kgo.HookGroupManageError.
func (h *fatalHook) OnGroupManageError(err error) {
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
	return kgo.WithHooks(&fatalHook{group: group, stop: stop})
}
