package consume

import (
	"testing"

	"go.uber.org/goleak"
)

// Workers start goroutines (their loop, units, commits, reads of held
// keys): none may outlive its test.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
