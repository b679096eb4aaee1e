// Package mongotest gives tests a MongoDB deployment: the embedded,
// in-process server of package mongofake by default, or a real MongoDB.
// It serves this module's own tests and users testing their own handlers.
//
// # Backends
//
// [Start] connects to the replica set named by OUTBOX_TEST_MONGODB_URI when
// that variable is set; otherwise it calls [StartEmbedded], which starts a
// new embedded server for the test (about a millisecond) and closes it in
// t.Cleanup. A server per test keeps fault injection ([Env.Server]:
// FailCommand, DropConnections, or the configureFailPoint command, enabled
// by default) and server options ([ServerOptions]) within that test.
//
// [StartReal] insists on a real MongoDB: OUTBOX_TEST_MONGODB_URI, else the
// test is skipped. [Connect] takes any other replica set's URI. Package
// mongocontainer, a module of its own so that testcontainers-go and the
// Docker client weigh only on the tests that import it, also starts a mongo:7
// container when a Docker engine answers.
//
// # Isolation
//
// Tests sharing a deployment (every test, against a real MongoDB) are
// isolated by database: [Env.DB] returns a database with a unique name
// derived from the test's name and drops it in t.Cleanup. Use only
// databases obtained that way and tests can run in parallel.
//
// # Usage
//
//	func TestHandler(t *testing.T) {
//		t.Parallel()
//		env := mongotest.Start(t)
//		db := env.DB(t)
//		// use env.Client and db...
//		if env.Server != nil {
//			// embedded only: inject faults
//		}
//	}
package mongotest
