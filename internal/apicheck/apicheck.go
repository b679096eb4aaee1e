// Package apicheck describes the exported API of Go packages as text, one
// line per exported identifier, method, field and interface method, sorted,
// so that a test can compare it with a golden file and a change to the
// public API shows as a diff of named lines.
//
// The description is read from the compiler's export data (go list
// -export), not from the source: it states what a user's code compiles
// against, so a declaration moved to an internal package behind a type
// alias keeps its fields and methods (the alias itself shows as "= path.T").
// The go command is run with GOPROXY=off, so it never reaches the network,
// and with -race when the caller is built with it, so the export data
// comes from the build cache that building the caller has just filled.
package apicheck

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"go/constant"
	"go/importer"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"sort"
	"strings"
)

// Load type-checks nothing itself: it asks the go command run in dir for
// the export data of the packages named by patterns and of their
// dependencies, and returns the named packages (not the dependencies) by
// import path.
func Load(dir string, patterns ...string) (map[string]*types.Package, error) {
	if len(patterns) == 0 {
		return nil, errors.New("apicheck: no package patterns")
	}
	args := []string{"list", "-e", "-export", "-deps", "-json=ImportPath,Export,DepOnly,Error"}
	if raceEnabled {
		// Export data built as the caller was: found in the build cache
		// instead of compiling every dependency once more.
		args = append(args, "-race")
	}
	args = append(args, "--")
	args = append(args, patterns...)
	cmd := exec.Command("go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOPROXY=off")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("apicheck: go list: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	exports := map[string]string{}
	var roots []string
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p struct {
			ImportPath string
			Export     string
			DepOnly    bool
			Error      *struct{ Err string }
		}
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			return nil, fmt.Errorf("apicheck: go list output: %w", err)
		}
		if p.Error != nil {
			return nil, fmt.Errorf("apicheck: package %s: %s", p.ImportPath, p.Error.Err)
		}
		exports[p.ImportPath] = p.Export
		if !p.DepOnly {
			roots = append(roots, p.ImportPath)
		}
	}
	fset := token.NewFileSet()
	imp := importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		file, ok := exports[path]
		if !ok || file == "" {
			return nil, fmt.Errorf("no export data for %s", path)
		}
		return os.Open(file)
	})
	pkgs := make(map[string]*types.Package, len(roots))
	for _, path := range roots {
		pkg, err := imp.Import(path)
		if err != nil {
			return nil, fmt.Errorf("apicheck: import %s: %w", path, err)
		}
		pkgs[path] = pkg
	}
	return pkgs, nil
}

// Describe returns the exported API of pkg, one line per item, the
// identifiers in sorted order, each type followed by its fields in
// declaration order and its methods sorted:
//
//	const Name Type = value
//	var Name Type
//	func Name[T any](params) results
//	type Name[T any] underlying          (or "type Name = path.T" for an alias)
//	field Type.Name type `tag`           (exported fields, embedded ones marked)
//	method (T) Name(params) results      (the method set of T, promoted ones included)
//	method (*T) Name(params) results     (methods of *T only)
//	method (I) name(params) results      (every method of an interface I)
//
// Types of other packages are qualified by their import path, types of pkg
// by their name alone. An interface lists every method of its method set,
// embedded and unexported ones included, since they decide who may
// implement it; a constraint interface's type set is on its "type" line.
func Describe(pkg *types.Package) string {
	qual := func(p *types.Package) string {
		if p == pkg {
			return ""
		}
		return p.Path()
	}
	var lines []string
	scope := pkg.Scope()
	for _, name := range scope.Names() {
		obj := scope.Lookup(name)
		if !obj.Exported() {
			continue
		}
		switch obj := obj.(type) {
		case *types.Const:
			lines = append(lines, fmt.Sprintf("const %s %s = %s", name,
				types.TypeString(obj.Type(), qual), constValue(obj.Val())))
		case *types.Var:
			lines = append(lines, fmt.Sprintf("var %s %s", name, types.TypeString(obj.Type(), qual)))
		case *types.Func:
			sig := obj.Type().(*types.Signature)
			// The signature's string carries its type parameters.
			lines = append(lines, "func "+name+strings.TrimPrefix(types.TypeString(sig, qual), "func"))
		case *types.TypeName:
			lines = append(lines, describeType(obj, qual)...)
		}
	}
	return strings.Join(lines, "\n") + "\n"
}

// describeType gives the "type" line of a named type or alias, then its
// exported fields and its exported methods.
func describeType(obj *types.TypeName, qual types.Qualifier) []string {
	name := obj.Name()
	if obj.IsAlias() {
		// The alias line names its target; the fields and methods below
		// are those of the target, so moving a type behind an alias
		// changes this one line only.
		target := obj.Type()
		if a, ok := target.(*types.Alias); ok {
			target = a.Rhs()
		}
		line := fmt.Sprintf("type %s%s = %s", name, aliasParams(obj.Type(), qual), types.TypeString(target, qual))
		named, ok := types.Unalias(obj.Type()).(*types.Named)
		if !ok {
			return []string{line}
		}
		return append([]string{line}, members(name, named, qual)...)
	}
	named, ok := obj.Type().(*types.Named)
	if !ok {
		return []string{fmt.Sprintf("type %s %s", name, types.TypeString(obj.Type(), qual))}
	}
	under := named.Underlying()
	head := fmt.Sprintf("type %s%s", name, typeParams(named.TypeParams(), qual))
	var line string
	if st, ok := under.(*types.Struct); ok {
		line = head + " struct"
		if hasUnexportedField(st) {
			line += " (has unexported fields)"
		}
	} else if iface, ok := under.(*types.Interface); ok && iface.IsMethodSet() {
		line = head + " interface" // its methods follow, embedded ones included
	} else {
		line = head + " " + types.TypeString(under, qual)
	}
	return append([]string{line}, members(name, named, qual)...)
}

// members lists the exported fields (of a struct) and the exported
// methods of named, under the identifier name.
func members(name string, named *types.Named, qual types.Qualifier) []string {
	var lines []string
	if st, ok := named.Underlying().(*types.Struct); ok {
		for i := range st.NumFields() {
			f := st.Field(i)
			if !f.Exported() {
				continue
			}
			kind := "field"
			if f.Embedded() {
				kind = "field (embedded)"
			}
			line := fmt.Sprintf("%s %s.%s %s", kind, name, f.Name(), types.TypeString(f.Type(), qual))
			if tag := st.Tag(i); tag != "" {
				line += " `" + tag + "`"
			}
			lines = append(lines, line)
		}
	}
	if iface, ok := named.Underlying().(*types.Interface); ok {
		if !iface.IsMethodSet() {
			return lines // a constraint: its type set is on the type line
		}
		// Every method, embedded and unexported ones included: they
		// decide who may implement it.
		for m := range iface.Methods() {
			sig := types.TypeString(m.Type(), qual)
			lines = append(lines, fmt.Sprintf("method (%s) %s%s", name, m.Name(), strings.TrimPrefix(sig, "func")))
		}
		return lines
	}
	var methods []string
	valueSet := types.NewMethodSet(named)
	inValue := map[string]bool{}
	for m := range valueSet.Methods() {
		inValue[m.Obj().Name()] = true
	}
	for m := range types.NewMethodSet(types.NewPointer(named)).Methods() {
		fn := m.Obj()
		if !fn.Exported() {
			continue
		}
		recv := "*" + name
		if inValue[fn.Name()] {
			recv = name
		}
		sig := types.TypeString(fn.Type(), qual)
		methods = append(methods, fmt.Sprintf("method (%s) %s%s", recv, fn.Name(), strings.TrimPrefix(sig, "func")))
	}
	sort.Strings(methods)
	return append(lines, methods...)
}

func hasUnexportedField(st *types.Struct) bool {
	for i := range st.NumFields() {
		if !st.Field(i).Exported() {
			return true
		}
	}
	return false
}

// typeParams renders a type parameter list with its constraints, or
// nothing when there is none.
func typeParams(list *types.TypeParamList, qual types.Qualifier) string {
	if list.Len() == 0 {
		return ""
	}
	parts := make([]string, list.Len())
	for i := range list.Len() {
		tp := list.At(i)
		parts[i] = tp.Obj().Name() + " " + types.TypeString(tp.Constraint(), qual)
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

// aliasParams renders the type parameters of a generic alias.
func aliasParams(t types.Type, qual types.Qualifier) string {
	if a, ok := t.(*types.Alias); ok {
		return typeParams(a.TypeParams(), qual)
	}
	return ""
}

// constValue renders a constant exactly, so that a changed default shows.
func constValue(v constant.Value) string {
	return v.ExactString()
}

// Diff lists the lines of want missing from got ("- " first) and the lines
// of got missing from want ("+ "), each once per occurrence, or returns ""
// when the two hold the same lines. Every line names its identifier, so
// the lines need no context around them.
func Diff(want, got string) string {
	count := map[string]int{}
	for _, l := range strings.Split(want, "\n") {
		count[l]++
	}
	for _, l := range strings.Split(got, "\n") {
		count[l]--
	}
	var gone, added []string
	for _, l := range strings.Split(want, "\n") {
		if count[l] > 0 {
			count[l]--
			gone = append(gone, "- "+l+"\n")
		}
	}
	for _, l := range strings.Split(got, "\n") {
		if count[l] < 0 {
			count[l]++
			added = append(added, "+ "+l+"\n")
		}
	}
	return strings.Join(gone, "") + strings.Join(added, "")
}
