package testkit

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
)

// RecreateTopic deletes topic through adm and creates it again with n
// partitions. A real broker deletes a topic in the background and refuses
// to create it again (TOPIC_ALREADY_EXISTS) until the deletion is done, so
// the creation is retried with backoff, for a minute at most. The new
// partitions may have no leader yet when it returns: the caller waits for
// them (kafkatest.Env.CreateTopic does).
func RecreateTopic(t testing.TB, adm *kadm.Client, topic string, n int32) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	deleted, err := adm.DeleteTopic(ctx, topic)
	if err == nil {
		err = deleted.Err
	}
	if err != nil {
		t.Fatalf("delete topic %q: %v", topic, err)
	}
	for backoff := 10 * time.Millisecond; ; backoff = min(2*backoff, time.Second) {
		created, err := adm.CreateTopic(ctx, n, -1, nil, topic)
		if err == nil {
			err = created.Err
		}
		if !errors.Is(err, kerr.TopicAlreadyExists) {
			if err != nil {
				t.Fatalf("create topic %q again: %v", topic, err)
			}
			return
		}
		timer := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			timer.Stop()
			t.Fatalf("topic %q still being deleted: %v", topic, ctx.Err())
		case <-timer.C:
		}
	}
}
