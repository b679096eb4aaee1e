// Package testkit holds the helpers that the tests of several packages of
// the module share: a log buffer a running Client writes while the test
// reads it, a poll with a deadline for conditions that become true in
// other goroutines, and the deletion and creation again of a Kafka topic.
//
// It imports no package of the module, the root included, so that the
// root's tests and the tests of the packages the root imports can all use
// it. It starts no goroutine.
package testkit
