package console

import (
	"net/http"
	"time"

	"github.com/event-outbox/outbox"
)

// healthService is one service's part of the health page.
type healthService struct {
	Name   string
	Report outbox.DoctorReport
	Err    string
}

// health shows, per service, the doctor's findings (outbox.Admin.Doctor):
// the settings of MongoDB and Kafka that break or risk a guarantee, with
// what was read and the fix. The checks run on each request.
//
// Reads: MongoDB: hello, the oplog's first
// and last entries (local.oplog.rs, natural order, limit 1), getParameter,
// getDefaultRWConcern, listCollections, listIndexes of the outbox, inbox
// and outbox_meta collections, the inbox stamp and stored partition counts
// (outbox_meta by _id), and the latest 10,000 outbox documents' field
// sizes (_id index, descending). Kafka, through kadm: Metadata,
// DescribeConfigs, ListOffsets and OffsetFetch of the service's topics and
// consumer group.
func (c *Console) health(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	ctx, cancel := c.ctx(r)
	defer cancel()
	out := make([]healthService, 0, len(c.services))
	for _, s := range c.services {
		hs := healthService{Name: s.Name}
		rep, err := s.admin.Doctor(ctx, outbox.DoctorOptions{Kafka: c.opts.Kafka, ConsumerGroup: s.ConsumerGroup, TopicPrefix: s.TopicPrefix})
		if err != nil {
			hs.Err = redact(err.Error())
		}
		for i := range rep.Findings {
			rep.Findings[i].Read = redact(rep.Findings[i].Read)
		}
		hs.Report = rep
		out = append(out, hs)
	}
	c.render(w, r, "health", nil, out, start)
}
