package apachekafka

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// WaitReady returns once every running, unpaused node answers Metadata
// listing every such node as a broker, or ctx ends, or a node's JVM exits
// (its error carries the tail of the node's logs). It polls with a backoff
// from 50 ms to 500 ms.
func (c *Cluster) WaitReady(ctx context.Context) error {
	backoff := 50 * time.Millisecond
	var last error
	for {
		var live []*Node
		for _, n := range c.nodes {
			if err := n.exited(); err != nil {
				return err
			}
			if n.Running() && !n.Paused() {
				live = append(live, n)
			}
		}
		last = nil
		for _, n := range live {
			if err := n.lists(ctx, live); err != nil {
				last = err
				break
			}
		}
		if last == nil {
			return nil
		}
		if err := wait(ctx, backoff); err != nil {
			return fmt.Errorf("apachekafka: cluster not ready: %w (last: %v)", err, last)
		}
		backoff = min(2*backoff, 500*time.Millisecond)
	}
}

// lists asks n itself for the cluster's brokers and reports an error unless
// every node of want is among them.
func (n *Node) lists(ctx context.Context, want []*Node) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(n.Addr), kgo.DialTimeout(time.Second))
	if err != nil {
		return err
	}
	defer cl.Close()
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req := kmsg.NewPtrMetadataRequest()
	req.Topics = []kmsg.MetadataRequestTopic{} // no topic: brokers only
	resp, err := req.RequestWith(rctx, cl.SeedBrokers()[0])
	if err != nil {
		return fmt.Errorf("node %d: %w", n.ID, err)
	}
	for _, w := range want {
		if !slices.ContainsFunc(resp.Brokers, func(b kmsg.MetadataResponseBroker) bool { return b.NodeID == w.ID }) {
			return fmt.Errorf("node %d does not list node %d yet", n.ID, w.ID)
		}
	}
	return nil
}

// client returns a kgo client seeded with every running, unpaused node.
func (c *Cluster) client() (*kgo.Client, error) {
	var seeds []string
	for _, n := range c.nodes {
		if n.Running() && !n.Paused() {
			seeds = append(seeds, n.Addr)
		}
	}
	if len(seeds) == 0 {
		return nil, errors.New("apachekafka: no node is running")
	}
	return kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.DialTimeout(time.Second))
}

// byID returns the node whose node.id is id.
func (c *Cluster) byID(id int32) (*Node, error) {
	for _, n := range c.nodes {
		if n.ID == id {
			return n, nil
		}
	}
	return nil, fmt.Errorf("apachekafka: no node has id %d", id)
}

// Leader returns the node leading partition of topic, as the running nodes
// report it.
func (c *Cluster) Leader(ctx context.Context, topic string, partition int32) (*Node, error) {
	cl, err := c.client()
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	req := kmsg.NewPtrMetadataRequest()
	rt := kmsg.NewMetadataRequestTopic()
	rt.Topic = kmsg.StringPtr(topic)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return nil, fmt.Errorf("apachekafka: metadata of %q: %w", topic, err)
	}
	for _, t := range resp.Topics {
		if err := kerr.ErrorForCode(t.ErrorCode); err != nil {
			return nil, fmt.Errorf("apachekafka: metadata of %q: %w", topic, err)
		}
		for _, p := range t.Partitions {
			if p.Partition != partition {
				continue
			}
			if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
				return nil, fmt.Errorf("apachekafka: partition %d of %q: %w", partition, topic, err)
			}
			return c.byID(p.Leader)
		}
	}
	return nil, fmt.Errorf("apachekafka: %q has no partition %d", topic, partition)
}

// Controller returns the active controller: the leader of the KRaft
// metadata quorum, asked with DescribeQuorum (Metadata's controller id is
// a random broker in KRaft mode).
func (c *Cluster) Controller(ctx context.Context) (*Node, error) {
	cl, err := c.client()
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	req := kmsg.NewPtrDescribeQuorumRequest()
	rt := kmsg.NewDescribeQuorumRequestTopic()
	rt.Topic = "__cluster_metadata"
	rp := kmsg.NewDescribeQuorumRequestTopicPartition()
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return nil, fmt.Errorf("apachekafka: describe quorum: %w", err)
	}
	if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
		return nil, fmt.Errorf("apachekafka: describe quorum: %w", err)
	}
	if len(resp.Topics) == 0 || len(resp.Topics[0].Partitions) == 0 {
		return nil, errors.New("apachekafka: describe quorum: empty response")
	}
	p := resp.Topics[0].Partitions[0]
	if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
		return nil, fmt.Errorf("apachekafka: describe quorum: %w", err)
	}
	if p.LeaderID < 0 {
		return nil, errors.New("apachekafka: the quorum has no leader")
	}
	return c.byID(p.LeaderID)
}
