package testkit

import (
	"testing"
	"time"
)

// pollEvery is how often Eventually asks its condition again: short
// enough that a test does not wait long past the moment the condition
// holds, long enough that polling does not compete with the goroutines it
// waits for.
const pollEvery = 20 * time.Millisecond

// Eventually polls cond until it returns true, and fails the test with
// "timed out waiting for <what>" when it still returns false after within.
// It is for conditions that other goroutines make true; it never sleeps
// once cond holds.
func Eventually(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(pollEvery)
	}
}
