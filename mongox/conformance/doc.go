// Package conformance is the MongoDB behaviour suite that the embedded
// server (mongox/mongofake) and a real MongoDB must both pass: the contract
// of the embedded server.
//
// Every case talks to the server through the official Go driver only
// (mongo.Client APIs and RunCommand for raw commands), in a database of its
// own, and states in its failure messages which MongoDB behaviour it checks.
//
// # Running
//
//	go test ./mongox/conformance/                     # embedded server (TestEmbedded); TestReal skips
//	OUTBOX_TEST_MONGODB_URI='mongodb://localhost:27017/?replicaSet=rs0' go test ./mongox/conformance/
//	OUTBOX_TEST_SLOW=1 ...                            # also the 60-90 s TTL case against a real server
//
// Without OUTBOX_TEST_MONGODB_URI, TestReal skips. The tests of the module
// mongox/mongotest/mongocontainer (cd there, go test ./...) run the suite
// against mongo:7 started with testcontainers when a Docker engine answers,
// and skip otherwise.
//
// # What is embedded-only
//
// Cases that need a server knob (a short TTL interval, a tiny oplog, a
// short transaction lifetime) or that check our own error messages for
// unsupported features skip against a real server and say why. Fail-point
// cases need configureFailPoint: against a real server they skip unless it
// runs with enableTestCommands=1. Fail points are limited to a client's
// unique appName so that parallel cases sharing a real server do not
// disturb each other.
//
// # Reading failures
//
// Case names say what is checked (TestEmbedded/Indexes/PartialUnique);
// table cases name their filter, update or projection in the subtest name;
// every assertion message states the MongoDB behaviour expected, and
// documents are compared as canonical extended JSON so that a difference of
// BSON type (int vs long vs double) or of field order shows in the diff.
// Groups map to the server's parts: Query to the query matcher, CRUD
// updates to the update operators, Aggregate to the pipeline, Indexes,
// Transactions, ChangeStreams and Catalog to the engine and its data
// commands, ClusterTime, FailPoints and the hello fields to the server's
// shell. An error "(NotImplemented) ... is not supported" marks a feature
// the embedded server rejects by design rather than a wrong answer.
//
// # Using it for another server
//
// [Run] takes an [EnvFunc], so any deployment reachable by the driver can be
// checked: return a mongotest.Env pointing at it.
package conformance
