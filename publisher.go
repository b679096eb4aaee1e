package outbox

import "context"

// runPublisher publishes recorded events until ctx ends.
//
// STUB: the publisher (issue 4) replaces this file.
func (c *Client) runPublisher(ctx context.Context) error {
	<-ctx.Done()
	return nil
}
