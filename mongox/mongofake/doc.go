// Package mongofake is an in-process MongoDB-compatible server for tests and
// local development. Clients reach it over the real wire protocol, so the
// official Go driver, mongosh, pymongo and other drivers work unchanged.
//
// # Scope
//
// The server presents itself as the primary of a single-node replica set
// (MongoDB 7.0, wire version 21): sessions, retryable reads and writes,
// multi-document transactions with snapshot isolation, change streams, and
// the common CRUD, aggregation and index commands. Anything it does not
// support fails with a clear error that names the command, operator or
// option; it never answers with silently wrong data.
//
// Data lives in memory only and is lost on Close.
//
// # Use in tests
//
//	srv, err := mongofake.NewServer()
//	if err != nil { ... }
//	defer srv.Close()
//	client, err := mongo.Connect(options.Client().ApplyURI(srv.URI()))
//
// URI returns a replica-set connection string (retryable writes, sessions,
// transactions and change streams work with the driver's defaults);
// DirectURI connects without replica set discovery. Give each test its own
// database name, or its own server: starting one is cheap (no process, no
// disk).
//
// # Fault injection
//
// FailCommand arms a fail point from Go: fail the next N commands of some
// names with an error code and labels, close the connection instead of
// replying, block for a while, or attach a writeConcernError.
// DropConnections closes every client connection at once. With
// EnableTestCommands(true) the same is available to any client through
// mongod's configureFailPoint command and its failCommand fail point (modes
// "alwaysOn", "off", {times: n}, {skip: n}), which is what the drivers'
// specification test suites use. Crash (Go only) makes one client, told
// apart by its application name, die at its Nth command of some names,
// before or after that command runs: it runs nothing more, and its open
// transactions stay open, for crash-consistency tests.
//
// # Limits
//
//   - No authentication or TLS: saslStart and authenticate fail with
//     AuthenticationFailed. Connect without credentials.
//   - No compression: OP_COMPRESSED closes the connection (no compressor is
//     ever negotiated). Legacy OP_QUERY is accepted only for commands
//     (namespace "<db>.$cmd"), as drivers use it for the first hello.
//   - No awaitable hello (topologyVersion is not reported) and no exhaust
//     cursors; drivers fall back to polling.
//   - One member only: reads with any read preference are served by the
//     primary.
package mongofake
