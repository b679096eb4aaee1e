// Package doctor checks the settings of servers the framework does not own
// that silently break its guarantees.
//
// Every guarantee rests on MongoDB and Kafka settings: a topic with
// unclean.leader.election.enable loses acknowledged events, a compacted
// topic drops records of a key before a consumer reads them, a
// transactionLifetimeLimitSeconds below the handler timeout aborts every
// slow handler. Run reads those settings and reports each one that breaks a
// guarantee, risks one, or deserves a note, with what it read and the fix.
// It reads only: it changes nothing.
//
// # What it owns
//
// The facts gathered from the servers (hello, the oplog's bounds,
// getParameter, the default write concern, the index lists; the topics'
// partitions, replicas, configs and offsets, the brokers' API versions and
// group settings) and the judgements: pure judge* functions that turn
// facts into findings, tested on hand-made facts. Each check runs in two
// steps, gather then judge.
//
// It does not own the storage format: it reads the service's collections
// (stored partition counts, the inbox's owner, sampled event sizes) and
// the indexes each collection needs through a Store, which Collections
// implements over internal/store. Nor does it own the public report: the
// root package converts
// Report into its DoctorReport and keeps Admin.Doctor, Client.Doctor and
// the check at Run's start.
//
// # Goroutines
//
// None. Run works on the caller's goroutine and returns when every check
// has run or ctx ended; every server read is bounded by ctx.
package doctor
