// Package mongocontainer gives tests a real MongoDB in a Docker container,
// started with testcontainers-go: [Start] is [mongotest.StartReal] plus a
// mongo:7 container when OUTBOX_TEST_MONGODB_URI is unset and a Docker
// engine answers.
//
// It is a module of its own (github.com/event-outbox/outbox/mongox/mongotest/mongocontainer)
// so that testcontainers-go and the Docker client it brings are required
// only by the tests that import this package, never by a service that
// imports the framework or package mongotest. Its tests also run the
// conformance suite (mongox/conformance) against the container:
//
//	cd mongox/mongotest/mongocontainer && go test ./...
//
// # Usage
//
//	func TestAgainstRealMongo(t *testing.T) {
//		env := mongocontainer.Start(t) // skips without a URI or Docker
//		db := env.DB(t)
//		// use env.Client and db...
//	}
package mongocontainer
