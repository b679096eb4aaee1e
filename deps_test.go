package outbox

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestGoModRequiresNoContainerRuntime guards what a service importing the
// framework pays for. The go.sum of such a service lists every module needed
// to build and test the framework's packages it imports, so a requirement
// of this module's go.mod used only by a test helper still weighs on it.
// testcontainers-go and the Docker client belong in the module
// mongox/mongotest/mongocontainer, the linter in tools.
func TestGoModRequiresNoContainerRuntime(t *testing.T) {
	t.Parallel()
	gomod, err := os.ReadFile("go.mod")
	require.NoError(t, err)
	for _, heavy := range []string{
		"github.com/testcontainers/", "github.com/docker/", "github.com/moby/",
		"github.com/containerd/", "honnef.co/go/tools",
	} {
		if strings.Contains(string(gomod), heavy) {
			t.Errorf("go.mod requires %s...: move the code that needs it to a module of its own", heavy)
		}
	}
}
