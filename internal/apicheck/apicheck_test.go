package apicheck

import (
	"go/ast"
	"go/parser"
	"go/token"
	"go/types"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// describeSource type-checks one file of package p and describes it.
func describeSource(t *testing.T, src string) string {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "p.go", "package p\n"+src, 0)
	require.NoError(t, err)
	pkg, err := new(types.Config).Check("example.com/p", fset, []*ast.File{f}, nil)
	require.NoError(t, err)
	return Describe(pkg)
}

const base = `
type Client struct {
	Name string ` + "`json:\"name\"`" + `
	Inner
	secret int
}
type Inner struct{ Depth int }
func (Inner) Promoted() {}
func (c *Client) Run(n int) error { return nil }
func (c Client) String() string { return "" }
func (c *Client) hidden() {}
type Handler interface { Handle(x string) error; seal(); Closer }
type Closer interface { Close() error }
type Set[T comparable] map[T]struct{}
func Map[T any, U any](in []T, f func(T) U) []U { return nil }
func New(name string) *Client { return nil }
const Version = "1.0"
const Limit = 3
var ErrGone error
type alias = Client
type Other = Inner
func unexported() {}
`

func TestDescribeListsEveryExportedItem(t *testing.T) {
	t.Parallel()
	got := describeSource(t, base)
	want := strings.Join([]string{
		"type Client struct (has unexported fields)",
		"field Client.Name string `json:\"name\"`",
		"field (embedded) Client.Inner Inner",
		"method (*Client) Run(n int) error",
		"method (Client) Promoted()",
		"method (Client) String() string",
		"type Closer interface",
		"method (Closer) Close() error",
		"var ErrGone error",
		"type Handler interface",
		"method (Handler) Close() error",
		"method (Handler) Handle(x string) error",
		"method (Handler) seal()",
		"type Inner struct",
		"field Inner.Depth int",
		"method (Inner) Promoted()",
		"const Limit untyped int = 3",
		"func Map[T, U any](in []T, f func(T) U) []U",
		"func New(name string) *Client",
		"type Other = Inner",
		"field Other.Depth int",
		"method (Other) Promoted()",
		"type Set[T comparable] map[T]struct{}",
		`const Version untyped string = "1.0"`,
	}, "\n")
	require.Equal(t, want+"\n", got)
}

// TestDescribeShowsEveryKindOfChange proves the golden comparison catches
// what it is for: each edit of base changes the description.
func TestDescribeShowsEveryKindOfChange(t *testing.T) {
	t.Parallel()
	before := describeSource(t, base)
	for name, edit := range map[string][2]string{
		"func removed":          {"func New(name string) *Client { return nil }", ""},
		"param type changed":    {"func New(name string)", "func New(name []byte)"},
		"result changed":        {"Run(n int) error { return nil }", "Run(n int) any { return nil }"},
		"method removed":        {"func (c Client) String() string { return \"\" }", ""},
		"receiver made pointer": {"func (c Client) String()", "func (c *Client) String()"},
		"field type changed":    {"Name string", "Name []string"},
		"tag changed":           {`json:"name"`, `json:"n"`},
		"promoted method lost":  {"func (Inner) Promoted() {}", ""},
		"interface grown":       {"Handle(x string) error;", "Handle(x string) error; Open();"},
		"constraint changed":    {"Set[T comparable]", "Set[T ~string]"},
		"embedded method grown": {"Close() error }", "Close() error; Flush() }"},
		"const value changed":   {"Limit = 3", "Limit = 4"},
		"var type changed":      {"var ErrGone error", "var ErrGone string"},
		"type made alias":       {"type Set[T comparable] map", "type Set[T comparable] = map"},
		"alias target changed":  {"type Other = Inner", "type Other = Client"},
	} {
		require.Contains(t, base, edit[0], name)
		after := describeSource(t, strings.Replace(base, edit[0], edit[1], 1))
		require.NotEqual(t, before, after, name)
	}
	unchanged := describeSource(t, strings.Replace(base, "func unexported() {}", "func unexported(int) {}", 1))
	require.Equal(t, before, unchanged, "an unexported change is not an API change")
}

// TestLoadReadsExportData runs the go command on this package.
func TestLoadReadsExportData(t *testing.T) {
	t.Parallel()
	pkgs, err := Load(".", ".")
	require.NoError(t, err)
	pkg := pkgs["github.com/event-outbox/outbox/internal/apicheck"]
	require.NotNil(t, pkg)
	require.Contains(t, Describe(pkg), "func Describe(pkg *go/types.Package) string\n")

	_, err = Load(".", "./no-such-package")
	require.Error(t, err)
	_, err = Load(".")
	require.Error(t, err)
}

func TestDiffNamesGoneAndNewLines(t *testing.T) {
	t.Parallel()
	require.Empty(t, Diff("a\nb\n", "a\nb\n"))
	require.Equal(t, "- b\n+ c\n+ c\n", Diff("a\nb\n", "a\nc\nc\n"))
	require.Equal(t, "- a\n", Diff("a\na\n", "a\n"))
}
