package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestREADMEEmbedSnippet keeps the README's "Embedding it in your service"
// snippet identical to the compiled Example_service in the root package.
func TestREADMEEmbedSnippet(t *testing.T) {
	t.Parallel()
	src, err := os.ReadFile("../example_service_test.go")
	require.NoError(t, err)
	readme, err := os.ReadFile("../README.md")
	require.NoError(t, err)

	const begin, end = "// README: begin embed\n", "// README: end embed"
	s := string(src)
	i, j := strings.Index(s, begin), strings.Index(s, end)
	require.True(t, i >= 0 && j > i, "markers missing in example_service_test.go")
	snippet := strings.Trim(s[i+len(begin):j], "\n")
	// A reader copies the snippet: it must say where outbox, mongo and
	// bson come from.
	require.True(t, strings.HasPrefix(snippet, "import ("), "the snippet starts with its imports")
	require.Contains(t, snippet, `"github.com/event-outbox/outbox"`)
	require.Contains(t, string(readme), "```go\n"+snippet+"\n```",
		"README.md's embedding snippet differs from Example_service in example_service_test.go: copy it over")
}

// TestREADMEConfigTable keeps the README's configuration table complete:
// one row per field of outbox.Config, in config.go's order.
func TestREADMEConfigTable(t *testing.T) {
	t.Parallel()
	f, err := parser.ParseFile(token.NewFileSet(), "../config.go", nil, parser.SkipObjectResolution)
	require.NoError(t, err)
	var fields []string
	ast.Inspect(f, func(n ast.Node) bool {
		ts, ok := n.(*ast.TypeSpec)
		if !ok || ts.Name.Name != "Config" {
			return true
		}
		for _, fl := range ts.Type.(*ast.StructType).Fields.List {
			for _, name := range fl.Names {
				fields = append(fields, name.Name)
			}
		}
		return false
	})
	require.NotEmpty(t, fields, "type Config not found in config.go")

	readme, err := os.ReadFile("../README.md")
	require.NoError(t, err)
	_, table, ok := strings.Cut(string(readme), "\n## Configuration\n")
	require.True(t, ok, "README.md has no Configuration section")
	table, _, _ = strings.Cut(table, "\n## ")
	var rows []string
	for line := range strings.Lines(table) {
		if rest, ok := strings.CutPrefix(line, "| `"); ok {
			name, _, _ := strings.Cut(rest, "`")
			rows = append(rows, name)
		}
	}
	require.Equal(t, fields, rows, "README.md's configuration table differs from the fields of outbox.Config")
}
