package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/event-outbox/outbox/internal/store"
)

// metaCollection holds the framework's metadata documents (inbox stamps,
// partition counts, replica records, recreated topics' resets; see
// store.MetaCollection).
const metaCollection = store.MetaCollection

// inboxStamp is the metadata document naming an inbox collection's owner.
type inboxStamp = store.InboxStamp

// stampInbox records Config.ConsumerGroup as the owner of the inbox
// collection if it has none, and returns an error wrapping ErrInboxOwned if
// another group owns it. Replicas of one service may call it at once: the
// stamp is an upsert that sets the owner only when it inserts, and a
// replica that loses the insertion race reads the winner's stamp.
func (c *Client) stampInbox(ctx context.Context) error {
	st, err := store.StampInbox(ctx, c.meta, c.cfg.InboxCollection, c.cfg.ConsumerGroup, c.cfg.Service)
	if err != nil {
		return err
	}
	if st.ConsumerGroup == c.cfg.ConsumerGroup {
		return nil
	}
	return fmt.Errorf("%w: inbox collection %q of database %q belongs to consumer group %q (service %q, since %s), "+
		"and this client's consumer group is %q: two services sharing an inbox collection skip each other's events. "+
		"Set Config.InboxCollection of this service to a collection of its own (for example %q). "+
		"If the collection was handed over on purpose (a renamed group), delete the document "+
		"{_id: {inbox: %q}} from the %s collection first",
		ErrInboxOwned, c.cfg.InboxCollection, c.cfg.Database, st.ConsumerGroup, st.Service,
		st.StampedAt.Format(time.RFC3339), c.cfg.ConsumerGroup, c.cfg.Service+"_inbox",
		c.cfg.InboxCollection, metaCollection)
}
