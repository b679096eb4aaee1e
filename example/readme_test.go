package main

import (
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"

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

// TestREADMEConfigTable keeps the configuration table of docs/configuration.md
// complete: one row per field of outbox.Config, in config.go's order.
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

	page, err := os.ReadFile("../docs/configuration.md")
	require.NoError(t, err)
	_, table, ok := strings.Cut(string(page), "\n| Field | Default | What it does |\n")
	require.True(t, ok, "docs/configuration.md has no configuration table")
	table, _, _ = strings.Cut(table, "\n\n")
	var rows []string
	for line := range strings.Lines(table) {
		if rest, ok := strings.CutPrefix(line, "| `"); ok {
			name, _, _ := strings.Cut(rest, "`")
			rows = append(rows, name)
		}
	}
	require.Equal(t, fields, rows, "docs/configuration.md's configuration table differs from the fields of outbox.Config")
}

// TestDocsLinks keeps the README and the pages of docs/ linked: every
// relative link names a file that exists and, with an anchor, a heading of
// that file (GitHub's anchors: lower case, punctuation dropped, spaces as
// hyphens). A "(next section)" that points to the wrong section, or a page
// moved without its links, fails here.
func TestDocsLinks(t *testing.T) {
	t.Parallel()
	pages, err := filepath.Glob("../docs/*.md")
	require.NoError(t, err)
	pages = append(pages, "../README.md", "../BENCHMARKS.md", "../ARCHITECTURE.md", "../CHANGELOG.md")
	anchors := map[string]map[string]bool{}
	headingsOf := func(path string) map[string]bool {
		if a, ok := anchors[path]; ok {
			return a
		}
		b, err := os.ReadFile(path)
		require.NoError(t, err)
		a, seen, fenced := map[string]bool{}, map[string]int{}, false
		for line := range strings.Lines(string(b)) {
			if strings.HasPrefix(line, "```") {
				fenced = !fenced
			}
			title, ok := strings.CutPrefix(strings.TrimLeft(line, "#"), " ")
			if fenced || !ok || !strings.HasPrefix(line, "#") {
				continue
			}
			slug := githubAnchor(title)
			if n := seen[slug]; n > 0 {
				a[fmt.Sprintf("%s-%d", slug, n)] = true
			} else {
				a[slug] = true
			}
			seen[slug]++
		}
		anchors[path] = a
		return a
	}
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	for _, page := range pages {
		b, err := os.ReadFile(page)
		require.NoError(t, err)
		for _, m := range link.FindAllStringSubmatch(string(b), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			file, anchor, _ := strings.Cut(target, "#")
			path := page
			if file != "" {
				path = filepath.Join(filepath.Dir(page), file)
				_, err := os.Stat(path)
				require.NoError(t, err, "%s links to %s, which does not exist", page, target)
			}
			if anchor != "" && strings.HasSuffix(path, ".md") {
				require.True(t, headingsOf(path)[anchor], "%s links to %s: no heading with that anchor", page, target)
			}
		}
	}
}

// githubAnchor is the anchor GitHub gives a Markdown heading.
func githubAnchor(title string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(title)) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// TestREADMEDocumentsTheFlags: every flag of the example is named in the
// README's quick start (-healthcheck was not), and -h says each default
// once (the texts of -replica-id and -payments-format said it twice).
func TestREADMEDocumentsTheFlags(t *testing.T) {
	t.Parallel()
	var help strings.Builder
	env := map[string]string{envReplicaID: "orders-1", envPaymentsFormat: "native"}
	err := run(t.Context(), []string{"-h"}, func(k string) string { return env[k] }, &help)
	require.ErrorIs(t, err, flag.ErrHelp)
	readme, err := os.ReadFile("../README.md")
	require.NoError(t, err)
	quick, _, _ := strings.Cut(string(readme), "\n## A walk through with curl")
	var flags []string
	for line := range strings.Lines(help.String()) {
		if name, ok := strings.CutPrefix(line, "  -"); ok {
			name, _, _ = strings.Cut(strings.TrimSpace(name), " ")
			name, _, _ = strings.Cut(name, "\t")
			flags = append(flags, name)
			require.Contains(t, quick, "`-"+name, "the README's quick start does not name -%s", name)
		} else {
			require.LessOrEqual(t, strings.Count(line, "default"), 1, "a default said twice: %q", line)
		}
	}
	require.Contains(t, flags, "healthcheck")
}
