package outbox

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestArchitecture keeps ARCHITECTURE.md true as code moves: every package
// directory of the repository (nested modules included) and every non-test
// file of the root package is named in it, in backquotes, and every path
// it names in backquotes exists.
func TestArchitecture(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("ARCHITECTURE.md")
	require.NoError(t, err)
	text := string(doc)

	pkgs, err := packageDirs(".")
	require.NoError(t, err)
	require.Contains(t, pkgs, ".")
	for _, dir := range pkgs {
		if !strings.Contains(text, "`"+dir+"`") {
			t.Errorf("ARCHITECTURE.md does not name the package `%s`", dir)
		}
	}

	roots, err := filepath.Glob("*.go")
	require.NoError(t, err)
	for _, f := range roots {
		if !strings.HasSuffix(f, "_test.go") && !strings.Contains(text, "`"+f+"`") {
			t.Errorf("ARCHITECTURE.md's file map does not name `%s`", f)
		}
	}

	for _, p := range namedPaths(text) {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("ARCHITECTURE.md names `%s`, which does not exist", p)
		}
	}
}

// TestRootImportsNoMongox guards what ARCHITECTURE.md's decision about
// mongox rests on: building the root package compiles no mongox package,
// so users of the framework pay nothing for the embedded server but its
// download.
func TestRootImportsNoMongox(t *testing.T) {
	t.Parallel()
	const module = "github.com/event-outbox/outbox"
	seen := map[string]bool{}
	queue := []string{module}
	for len(queue) > 0 {
		path := queue[0]
		queue = queue[1:]
		if seen[path] {
			continue
		}
		seen[path] = true
		require.False(t, strings.HasPrefix(path, module+"/mongox"), "the root package depends on %s", path)
		imports, err := nonTestImports("." + strings.TrimPrefix(path, module))
		require.NoError(t, err)
		for _, imp := range imports {
			if imp == module || strings.HasPrefix(imp, module+"/") {
				queue = append(queue, imp)
			}
		}
	}
	require.Contains(t, seen, module+"/internal/consume", "the walk follows the module's imports")
}

// TestInternalPackagesImportNoRoot keeps the layering ARCHITECTURE.md
// states: the root package glues the internal packages together, so an
// internal package that imported it would be a cycle in the making and
// would tie a mechanism to the public API it is meant to stay behind.
// Each internal package's non-test files are checked.
func TestInternalPackagesImportNoRoot(t *testing.T) {
	t.Parallel()
	const module = "github.com/event-outbox/outbox"
	pkgs, err := packageDirs("internal")
	require.NoError(t, err)
	require.Contains(t, pkgs, "internal/testkit", "the walk lists the internal packages")
	for _, dir := range pkgs {
		imports, err := nonTestImports(dir)
		require.NoError(t, err)
		require.NotContains(t, imports, module, "%s imports the root package", dir)
	}
}

// packageDirs lists the directories under root holding .go files, as
// slash paths relative to root ("." for root itself), skipping testdata
// and hidden directories as the go command does.
func packageDirs(root string) ([]string, error) {
	var dirs []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != root && (name == "testdata" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_")) {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(name, ".go") {
			dir := filepath.ToSlash(filepath.Dir(path))
			if !slices.Contains(dirs, dir) {
				dirs = append(dirs, dir)
			}
		}
		return nil
	})
	return dirs, err
}

// pathToken is a backquoted token that names a file or directory of the
// repository: it has a slash or ends in a file extension the repository
// uses, and holds no placeholder or wildcard.
var pathToken = regexp.MustCompile("`([A-Za-z0-9_.-]+(?:/[A-Za-z0-9_.-]+)*/?)`")

// namedPaths returns the paths named in backquotes in text.
func namedPaths(text string) []string {
	var out []string
	for _, m := range pathToken.FindAllStringSubmatch(text, -1) {
		p := m[1]
		ext := filepath.Ext(p)
		isFile := ext == ".go" || ext == ".md" || ext == ".mod" || ext == ".txt" || ext == ".yml"
		if p == "." || (!strings.Contains(p, "/") && !isFile) {
			continue
		}
		if strings.Contains(p, "/") && !isFile && strings.Count(p, ".") > 0 && !strings.HasPrefix(p, "docs") {
			// An import path such as golang.org/x/text, not a directory.
			continue
		}
		out = append(out, p)
	}
	return out
}

// nonTestImports lists the imports of the non-test Go files of dir.
func nonTestImports(dir string) ([]string, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return nil, err
	}
	var out []string
	fset := token.NewFileSet()
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(fset, f, nil, parser.ImportsOnly)
		if err != nil {
			return nil, err
		}
		for _, imp := range af.Imports {
			p, err := strconv.Unquote(imp.Path.Value)
			if err != nil {
				return nil, err
			}
			out = append(out, p)
		}
	}
	return out, nil
}

// TestNamedPathsFindsPaths checks the token rule TestArchitecture relies
// on, so that a bogus path is reported rather than skipped.
func TestNamedPathsFindsPaths(t *testing.T) {
	t.Parallel()
	got := namedPaths("`client.go` `internal/consume` `docs/` `ARCHITECTURE.md` `Config.DrainTimeout` " +
		"`golang.org/x/text` `outbox_meta` `.` `testdata/api` `internal/nosuch/file.go` `go.mod`")
	require.Equal(t, []string{"client.go", "internal/consume", "docs/", "ARCHITECTURE.md",
		"testdata/api", "internal/nosuch/file.go", "go.mod"}, got)
}

// TestInternalImportsNoRoot keeps the layering ARCHITECTURE.md describes:
// the root package is the API over the internal packages, so no internal
// package (nor a package under one) imports the root, which would make
// the mechanism depend on the API it serves.
func TestInternalImportsNoRoot(t *testing.T) {
	t.Parallel()
	const module = "github.com/event-outbox/outbox"
	pkgs, err := packageDirs(".")
	require.NoError(t, err)
	checked := 0
	for _, dir := range pkgs {
		if !strings.HasPrefix(dir, "internal/") {
			continue
		}
		checked++
		imports, err := nonTestImports(dir)
		require.NoError(t, err)
		require.NotContains(t, imports, module, "%s imports the root package", dir)
	}
	require.NotZero(t, checked, "the walk finds the internal packages")
}
