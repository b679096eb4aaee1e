package main

import (
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
	require.Contains(t, string(readme), "```go\n"+snippet+"\n```",
		"README.md's embedding snippet differs from Example_service in example_service_test.go: copy it over")
}
