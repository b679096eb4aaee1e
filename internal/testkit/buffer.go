package testkit

import (
	"bytes"
	"sync"
)

// Buffer is a bytes.Buffer guarded by a mutex, so that several goroutines
// may write and read it: the log output of a running Client that a test
// reads while it runs. The zero value is ready.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns what was written so far.
func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
