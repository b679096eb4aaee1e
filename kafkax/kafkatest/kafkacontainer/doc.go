// Package kafkacontainer gives tests a real Kafka broker in a Docker
// container, started with testcontainers-go: [Start] is
// [kafkatest.StartReal] plus a single-node container of [ContainerImage]
// when OUTBOX_TEST_KAFKA_BROKERS is unset and a Docker engine answers.
//
// It is a module of its own (github.com/event-outbox/outbox/kafkax/kafkatest/kafkacontainer)
// so that testcontainers-go and the Docker client it brings are required
// only by the tests that import this package, never by a service that
// imports the framework or package kafkatest:
//
//	cd kafkax/kafkatest/kafkacontainer && go test ./...
//
// # Usage
//
//	func TestAgainstRealKafka(t *testing.T) {
//		env := kafkacontainer.Start(t) // skips without brokers or Docker
//		topic := env.Topic(t, 3)
//		// use env.Seeds, env.Client(t, ...) and topic...
//	}
package kafkacontainer
