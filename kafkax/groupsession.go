package kafkax

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Broker and group settings of KIP-848 consumer groups.
const (
	// BrokerConsumerSessionTimeout is the brokers' session timeout of
	// KIP-848 group members.
	BrokerConsumerSessionTimeout = "group.consumer.session.timeout.ms"
	// GroupConsumerSessionTimeout is a group's own override of it (a
	// GROUP config resource, Kafka 4.0+).
	GroupConsumerSessionTimeout = "consumer.session.timeout.ms"
)

// ConsumerGroupSessionTimeout returns the session timeout after which the
// coordinator of group expires a KIP-848 member that stopped heartbeating:
// the shortest of every broker's group.consumer.session.timeout.ms (any of
// them may become the coordinator) and of the group's own
// consumer.session.timeout.ms when it is set. The shortest is never longer
// than the one the coordinator applies, so a lease computed from it is
// safe. cl sends the requests (a kgo.Client). It fails when no broker
// reports the setting (a broker older than Kafka 4.0, or no
// DescribeConfigs permission on the cluster).
func ConsumerGroupSessionTimeout(ctx context.Context, cl kmsg.Requestor, group string) (time.Duration, error) {
	meta := kmsg.NewPtrMetadataRequest()
	meta.Topics = []kmsg.MetadataRequestTopic{} // brokers only
	mresp, err := meta.RequestWith(ctx, cl)
	if err != nil {
		return 0, fmt.Errorf("read the brokers: %w", err)
	}
	req := kmsg.NewPtrDescribeConfigsRequest()
	for _, b := range mresp.Brokers {
		r := kmsg.NewDescribeConfigsRequestResource()
		r.ResourceType = kmsg.ConfigResourceTypeBroker
		r.ResourceName = strconv.Itoa(int(b.NodeID))
		r.ConfigNames = []string{BrokerConsumerSessionTimeout}
		req.Resources = append(req.Resources, r)
	}
	r := kmsg.NewDescribeConfigsRequestResource()
	r.ResourceType = kmsg.ConfigResourceTypeGroupConfig
	r.ResourceName = group
	r.ConfigNames = []string{GroupConsumerSessionTimeout}
	req.Resources = append(req.Resources, r)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return 0, fmt.Errorf("describe the session timeout configs: %w", err)
	}
	var shortest time.Duration
	var errs []error
	brokers := 0
	for _, res := range resp.Resources {
		if err := kerr.ErrorForCode(res.ErrorCode); err != nil {
			// A broker too old for GROUP resources refuses that one
			// resource; the brokers' settings still bound the session.
			if res.ResourceType == kmsg.ConfigResourceTypeBroker {
				errs = append(errs, fmt.Errorf("broker %s: %w", res.ResourceName, err))
			}
			continue
		}
		for _, c := range res.Configs {
			if c.Value == nil || (c.Name != BrokerConsumerSessionTimeout && c.Name != GroupConsumerSessionTimeout) {
				continue
			}
			ms, err := strconv.ParseInt(*c.Value, 10, 64)
			if err != nil || ms <= 0 {
				errs = append(errs, fmt.Errorf("%s %s: %s=%q is not a positive number of milliseconds", res.ResourceType, res.ResourceName, c.Name, *c.Value))
				continue
			}
			if res.ResourceType == kmsg.ConfigResourceTypeBroker {
				brokers++
			}
			if d := time.Duration(ms) * time.Millisecond; shortest == 0 || d < shortest {
				shortest = d
			}
		}
	}
	if len(errs) > 0 {
		return 0, errors.Join(errs...)
	}
	if brokers < len(mresp.Brokers) || shortest == 0 {
		return 0, fmt.Errorf("%d of %d brokers report %s (Kafka 4.0 or later, and DescribeConfigs on the cluster, are needed)", brokers, len(mresp.Brokers), BrokerConsumerSessionTimeout)
	}
	return shortest, nil
}
