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
}

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
