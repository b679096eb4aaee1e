package mongofake

import (
	"errors"
	"fmt"
	"sync"
)

// Crash describes the death of a client process at one of its commands,
// for crash-consistency tests: a test records the write commands an
// operation makes, then crashes it at each of them in turn and checks what
// a fresh client recovers from the state left behind.
//
// The client is told apart by the application name its driver sends in the
// handshake (options.Client().SetAppName). Its commands named in Commands
// are counted in the order the server receives them; the At-th one is the
// crash point. From that point on the client is dead: every command of its
// connections fails at once without running (error 11601, Interrupted, with
// no error labels, so that no driver retries it), except the handshake and
// monitoring commands (hello, isMaster), which change nothing. So nothing
// the client sends after its crash point reaches the data: no write, no
// commit, no abort, no endSessions. Its open transactions stay open, with
// their locks, until they are ended (killSessions, endSessions from
// another client) or outlive TransactionLifetime, as a dead process leaves
// them on mongod.
//
// There is no such command in mongod; it is built on the same place as the
// failCommand fail point (before a command runs) and is reachable from Go
// only.
type Crash struct {
	// AppName is the application name of the client that dies. Required.
	AppName string
	// Commands are the command names counted, as sent (for example
	// "update", "commitTransaction"). Required.
	Commands []string
	// At is which of the counted commands is the crash point, from 1.
	// Required.
	At int
	// AfterRun lets the crash point's command run before the client dies:
	// its effect stays (a commit is committed) and its reply is lost.
	// Defaults to false: the client dies before the command runs.
	AfterRun bool
}

// Crashed is an armed Crash.
type Crashed struct {
	set   *crashes
	spec  Crash
	names map[string]bool
	fired chan struct{}

	// Under set.mu.
	seen int
	dead bool
}

// Fired returns a channel closed once the client has reached its crash
// point (the command has been refused, or has run with AfterRun).
func (c *Crashed) Fired() <-chan struct{} { return c.fired }

// Seen returns how many of the counted commands the server has received
// from the client so far (the crash point's included).
func (c *Crashed) Seen() int {
	c.set.mu.Lock()
	defer c.set.mu.Unlock()
	return c.seen
}

// Disarm removes the crash: the client's later commands run again, as a
// restarted process under the same name would. Safe to call more than once.
func (c *Crashed) Disarm() {
	c.set.mu.Lock()
	defer c.set.mu.Unlock()
	for i, x := range c.set.list {
		if x == c {
			c.set.list = append(c.set.list[:i:i], c.set.list[i+1:]...)
			return
		}
	}
}

// crashes is the set of armed crashes of a server.
type crashes struct {
	mu   sync.Mutex
	list []*Crashed
}

// crashAction is what dispatch does with a command of a crashing client.
type crashAction int

const (
	crashNone     crashAction = iota // run it
	crashRefuse                      // fail it without running it
	crashAfterRun                    // run it, then reply as crashed
)

// Crash arms a crash (see Crash). It returns an error for an incomplete
// description. The crash stays armed until Disarm, or the server closes.
func (s *Server) Crash(c Crash) (*Crashed, error) {
	switch {
	case c.AppName == "":
		return nil, errors.New("mongofake: Crash needs the AppName of the client that dies")
	case len(c.Commands) == 0:
		return nil, errors.New("mongofake: Crash needs the Commands it counts")
	case c.At < 1:
		return nil, fmt.Errorf("mongofake: Crash.At is %d; the crash point is counted from 1", c.At)
	}
	cr := &Crashed{set: &s.crashes, spec: c, names: map[string]bool{}, fired: make(chan struct{})}
	for _, n := range c.Commands {
		cr.names[n] = true
	}
	s.crashes.mu.Lock()
	defer s.crashes.mu.Unlock()
	s.crashes.list = append(s.crashes.list, cr)
	return cr, nil
}

// check counts a command of a client and says what to do with it.
func (cs *crashes) check(name, appName string) (crashAction, *Crashed) {
	if appName == "" {
		return crashNone, nil
	}
	cs.mu.Lock()
	defer cs.mu.Unlock()
	for _, c := range cs.list {
		if c.spec.AppName != appName {
			continue
		}
		if c.dead {
			if handshakeCommands[name] {
				return crashNone, nil
			}
			return crashRefuse, c
		}
		if !c.names[name] {
			continue
		}
		c.seen++
		if c.seen < c.spec.At {
			continue
		}
		c.dead = true
		close(c.fired)
		if c.spec.AfterRun {
			return crashAfterRun, c
		}
		return crashRefuse, c
	}
	return crashNone, nil
}

// handshakeCommands answer a dead client still: they change nothing, and
// refusing them would only make its driver wait for server selection.
var handshakeCommands = map[string]bool{"hello": true, "isMaster": true, "ismaster": true}

// crashError is the error a dead client's commands get.
func (c *Crashed) crashError(name string) *cmdError {
	return errorf(11601, "Interrupted", fmt.Sprintf("mongofake: client %q crashed at its counted command %d (Server.Crash); %s did not reach the data",
		c.spec.AppName, c.spec.At, name))
}
