// Package lifecycle runs a process's background units beside its HTTP
// server, from the first request to the last, and shuts both down on a
// signal within a grace period.
//
// # What it owns
//
//   - The order of a process's life: listen, serve at once (liveness),
//     run every Unit, report readiness; on a signal, the context's end, a
//     Unit's failure or the HTTP server's, turn readiness false, wait the
//     shutdown delay, then stop the HTTP server and the Units at the same
//     time, bounded by the grace period; name what did not stop.
//   - Signal handling: the first signal starts the shutdown; the handling
//     is released then, so a second signal ends the process at once (Go's
//     default handling).
//   - The probes (ready and live paths) and the request deadline, wrapped
//     around the caller's handler, and the serving and stopping state the
//     readiness reads (State).
//
// It does not import the root package: outbox.Server checks its own
// fields, turns its Clients into Units and keeps the public readiness
// (Server.Ready, with the root's ErrNotReady), which it gives Process as
// a function.
//
// # Goroutines
//
// Process.Run starts, and waits for or bounds, all of them before it
// returns: one per Unit (Unit.Run under a context the shutdown cancels),
// one waiting for the Units, the HTTP server's Serve (ended by Shutdown or
// Close), and the readiness reporter (ended when the server is ready or
// the shutdown begins). A Unit still running after the grace period is
// left to the process's exit, and named in Run's error.
package lifecycle
