package outbox

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/event-outbox/outbox/internal/apicheck"
	"github.com/stretchr/testify/require"
)

var updateAPI = flag.Bool("update", false, "rewrite the golden files of TestPublicAPI (testdata/api)")

// publicPackages are the packages of this module a user may import, and
// so whose exported API is a promise. The commands and the internal
// packages are not; the nested modules (kafkacontainer, mongocontainer)
// are versioned with their own go.mod.
var publicPackages = []string{
	".", "./console", "./kafkax", "./kafkax/kafkatest",
	"./mongox/conformance", "./mongox/mongofake", "./mongox/mongotest",
}

// TestPublicAPI compares the exported API of every public package, each
// identifier with its signature, its fields and its methods, with
// testdata/api/<package>.txt, so that moving code between packages cannot
// change what users compile against unnoticed. After an intended change,
// regenerate with `go test -run TestPublicAPI -update .` and review the
// diff, which the CHANGELOG should then mention.
func TestPublicAPI(t *testing.T) {
	t.Parallel()
	pkgs, err := apicheck.Load(".", publicPackages...)
	require.NoError(t, err)
	require.Len(t, pkgs, len(publicPackages))
	const module = "github.com/event-outbox/outbox"
	for _, rel := range publicPackages {
		path := module + strings.TrimPrefix(rel, ".")
		pkg := pkgs[path]
		require.NotNil(t, pkg, path)
		name := strings.ReplaceAll(strings.TrimPrefix(rel, "./"), "/", "_")
		if name == "." {
			name = "outbox"
		}
		golden := filepath.Join("testdata", "api", name+".txt")
		got := apicheck.Describe(pkg)
		if *updateAPI {
			require.NoError(t, os.MkdirAll(filepath.Dir(golden), 0o755))
			require.NoError(t, os.WriteFile(golden, []byte(got), 0o644))
			continue
		}
		want, err := os.ReadFile(golden)
		require.NoError(t, err, "no golden file: run go test -run TestPublicAPI -update .")
		if diff := apicheck.Diff(string(want), got); diff != "" {
			t.Errorf("the exported API of %s is not %s (- gone, + new):\n%s"+
				"if intended, run go test -run TestPublicAPI -update . and review the diff",
				path, golden, diff)
		}
	}
}
