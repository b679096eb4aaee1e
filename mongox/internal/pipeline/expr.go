package pipeline

import (
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// Env carries the values an aggregation sees from its surroundings.
type Env struct {
	// Now is the value of $$NOW. Defaults to the wall clock when Run (or
	// Eval) starts.
	Now time.Time
	// ClusterTime is the value of $$CLUSTER_TIME.
	ClusterTime bson.Timestamp
	// Vars are user variables visible everywhere in the pipeline (a
	// command's let parameters, already evaluated), in order. A $let,
	// $map, $filter or $reduce variable of the same name shadows one.
	Vars bson.D
	// Lookup returns the documents of a collection of the same database,
	// for $lookup. nil makes $lookup fail.
	Lookup func(coll string) ([]bson.D, error)
}

// evalFn is a compiled expression.
type evalFn func(c *ctx) (any, error)

// ctx is the evaluation state of one document.
type ctx struct {
	root    bson.D
	current any
	now     bson.DateTime
	cluster bson.Timestamp
	vars    []binding
	lookup  func(coll string) ([]bson.D, error)
}

type binding struct {
	name string
	val  any
}

func newCtx(doc bson.D, env *Env) *ctx {
	now := env.Now
	if now.IsZero() {
		now = time.Now()
	}
	return &ctx{root: doc, current: doc, now: bson.NewDateTimeFromTime(now), cluster: env.ClusterTime, lookup: env.Lookup}
}

// reset points the context at another document.
func (c *ctx) reset(doc bson.D) {
	c.root, c.current, c.vars = doc, doc, c.vars[:0]
}

func (c *ctx) lookupVar(name string) any {
	for i := len(c.vars) - 1; i >= 0; i-- {
		if c.vars[i].name == name {
			return c.vars[i].val
		}
	}
	return missing
}

// Eval evaluates an aggregation expression against doc. A missing result
// (an absent field, $$REMOVE) is returned as nil.
func Eval(expr any, doc bson.D, env Env) (any, error) {
	fn, err := CompileExprWithVars(expr, env.Vars)
	if err != nil {
		return nil, err
	}
	return fn.Eval(doc, env)
}

// Expr is a compiled aggregation expression.
type Expr struct{ fn evalFn }

// CompileExpr parses an aggregation expression once, for repeated Eval.
func CompileExpr(expr any) (*Expr, error) {
	return CompileExprWithVars(expr, nil)
}

// CompileExprWithVars is CompileExpr with user variables (let parameters)
// in scope as constants.
func CompileExprWithVars(expr any, vars bson.D) (*Expr, error) {
	p := parser{vars: vars}
	fn, err := p.parse(normalize(expr))
	if err != nil {
		return nil, err
	}
	return &Expr{fn: fn}, nil
}

// Eval evaluates the expression against doc; a missing result is nil.
func (e *Expr) Eval(doc bson.D, env Env) (any, error) {
	v, err := e.fn(newCtx(doc, &env))
	if err != nil {
		return nil, err
	}
	return exportValue(v), nil
}

// parser compiles expressions; scope holds the user variables visible at
// the current point ($let, $map, $filter, $reduce).
type parser struct {
	scope []string
	vars  bson.D // constants visible as $$name (let parameters)
}

func (p *parser) inScope(name string) bool {
	for _, s := range p.scope {
		if s == name {
			return true
		}
	}
	return false
}

func (p *parser) push(names ...string) func() {
	n := len(p.scope)
	p.scope = append(p.scope, names...)
	return func() { p.scope = p.scope[:n] }
}

func constant(v any) evalFn { return func(*ctx) (any, error) { return v, nil } }

// parse compiles one expression (already normalized).
func (p *parser) parse(v any) (evalFn, error) {
	switch x := v.(type) {
	case string:
		if strings.HasPrefix(x, "$") {
			return p.parsePath(x)
		}
		return constant(x), nil
	case bson.D:
		if len(x) > 0 && strings.HasPrefix(x[0].Key, "$") {
			if len(x) != 1 {
				return nil, errf(15983, "an expression specification must contain exactly one field, the name of the expression. Found %d fields in %s", len(x), render(x))
			}
			return p.parseOperator(x[0].Key, x[0].Value)
		}
		return p.parseObject(x)
	case bson.A:
		fns := make([]evalFn, len(x))
		for i, e := range x {
			fn, err := p.parse(e)
			if err != nil {
				return nil, err
			}
			fns[i] = fn
		}
		return func(c *ctx) (any, error) {
			out := make(bson.A, len(fns))
			for i, fn := range fns {
				v, err := fn(c)
				if err != nil {
					return nil, err
				}
				out[i] = orNull(v)
			}
			return out, nil
		}, nil
	}
	return constant(v), nil
}

func (p *parser) parseObject(d bson.D) (evalFn, error) {
	keys := make([]string, len(d))
	fns := make([]evalFn, len(d))
	seen := make(map[string]bool, len(d))
	for i, e := range d {
		if strings.HasPrefix(e.Key, "$") {
			return nil, errf(16404, "a nested object must not contain a field starting with '$': %s", e.Key)
		}
		if strings.Contains(e.Key, ".") {
			return nil, errf(16412, "FieldPath field names may not contain '.'. Consider using $getField or $setField.")
		}
		if seen[e.Key] {
			return nil, errf(16406, "duplicate field name specified in object literal: %s", render(d))
		}
		seen[e.Key] = true
		fn, err := p.parse(e.Value)
		if err != nil {
			return nil, err
		}
		keys[i], fns[i] = e.Key, fn
	}
	return func(c *ctx) (any, error) {
		out := make(bson.D, 0, len(fns))
		for i, fn := range fns {
			v, err := fn(c)
			if err != nil {
				return nil, err
			}
			if !isMissing(v) {
				out = append(out, bson.E{Key: keys[i], Value: v})
			}
		}
		return out, nil
	}, nil
}

// splitFieldPath validates the parts of a dotted path (without the '$').
func splitFieldPath(path string) ([]string, error) {
	if path == "" {
		return nil, errf(40352, "FieldPath cannot be constructed with empty string")
	}
	parts := strings.Split(path, ".")
	for _, part := range parts {
		if part == "" {
			return nil, errf(15998, "FieldPath field names may not be empty strings.")
		}
		if strings.HasPrefix(part, "$") {
			return nil, errf(16410, "FieldPath field names may not start with '$'. Consider using $getField or $setField.")
		}
	}
	return parts, nil
}

func (p *parser) parsePath(s string) (evalFn, error) {
	if strings.HasPrefix(s, "$$") {
		name, rest, _ := strings.Cut(s[2:], ".")
		if name == "" {
			return nil, errf(16869, "empty variable name")
		}
		var parts []string
		if rest != "" || strings.Contains(s[2:], ".") {
			var err error
			if parts, err = splitFieldPath(rest); err != nil {
				return nil, err
			}
		}
		var base evalFn
		switch {
		case p.inScope(name):
			base = func(c *ctx) (any, error) { return c.lookupVar(name), nil }
		case hasVar(p.vars, name):
			base = constant(varValue(p.vars, name))
		case name == "ROOT":
			base = func(c *ctx) (any, error) { return c.root, nil }
		case name == "CURRENT":
			base = func(c *ctx) (any, error) { return c.current, nil }
		case name == "NOW":
			base = func(c *ctx) (any, error) { return c.now, nil }
		case name == "CLUSTER_TIME":
			base = func(c *ctx) (any, error) { return c.cluster, nil }
		case name == "REMOVE":
			base = constant(missing)
		case name == "DESCEND", name == "PRUNE", name == "KEEP":
			base = constant(redactMarker(name))
		default:
			return nil, errf(17276, "Use of undefined variable: %s", name)
		}
		if len(parts) == 0 {
			return base, nil
		}
		return func(c *ctx) (any, error) {
			v, _ := base(c)
			return walkPath(v, parts), nil
		}, nil
	}
	if s == "$" {
		return nil, errf(16872, "'$' by itself is not a valid FieldPath")
	}
	parts, err := splitFieldPath(s[1:])
	if err != nil {
		return nil, err
	}
	if len(parts) == 1 {
		key := parts[0]
		return func(c *ctx) (any, error) {
			if d, ok := c.current.(bson.D); ok {
				return getField(d, key), nil
			}
			return walkPath(c.current, parts), nil
		}, nil
	}
	return func(c *ctx) (any, error) { return walkPath(c.current, parts), nil }, nil
}

// redactMarker is the value of $$DESCEND, $$PRUNE and $$KEEP.
type redactMarker string

// opParser compiles the argument of one expression operator.
type opParser func(p *parser, name string, arg any) (evalFn, error)

// operators is the expression operator table, filled by the ops_*.go files.
var operators = map[string]opParser{}

func (p *parser) parseOperator(name string, arg any) (evalFn, error) {
	op, ok := operators[name]
	if !ok {
		return nil, errf(codeInvalidPipelineOperator, "Unrecognized expression '%s'", name)
	}
	return op(p, name, arg)
}

// args compiles an operator argument as a list: an array is the list, any
// other value a list of one.
func (p *parser) args(arg any) ([]evalFn, error) {
	list, ok := arg.(bson.A)
	if !ok {
		list = bson.A{arg}
	}
	fns := make([]evalFn, len(list))
	for i, e := range list {
		fn, err := p.parse(e)
		if err != nil {
			return nil, err
		}
		fns[i] = fn
	}
	return fns, nil
}

// nargs compiles a list of exactly n arguments (or between lo and hi).
func (p *parser) nargs(name string, arg any, lo, hi int) ([]evalFn, error) {
	fns, err := p.args(arg)
	if err != nil {
		return nil, err
	}
	if len(fns) < lo || len(fns) > hi {
		if lo == hi {
			return nil, errf(16020, "Expression %s takes exactly %d arguments. %d were passed in.", name, lo, len(fns))
		}
		return nil, errf(16020, "Expression %s takes at least %d arguments, and at most %d. %d were passed in.", name, lo, hi, len(fns))
	}
	return fns, nil
}

// evalAll evaluates a list of arguments.
func evalAll(c *ctx, fns []evalFn) ([]any, error) {
	out := make([]any, len(fns))
	for i, fn := range fns {
		v, err := fn(c)
		if err != nil {
			return nil, err
		}
		out[i] = v
	}
	return out, nil
}

// objArgs reads an object-shaped operator argument, checking field names
// against the allowed set and required ones.
func (p *parser) objArgs(name string, arg any, allowed []string, required ...string) (map[string]any, error) {
	d, ok := arg.(bson.D)
	if !ok {
		return nil, errf(codeFailedToParse, "%s expects an object as its argument, found %s", name, typeName(arg))
	}
	out := make(map[string]any, len(d))
	for _, e := range d {
		found := false
		for _, a := range allowed {
			if a == e.Key {
				found = true
				break
			}
		}
		if !found {
			return nil, errf(codeFailedToParse, "%s found an unknown argument: %s", name, e.Key)
		}
		out[e.Key] = e.Value
	}
	for _, r := range required {
		if _, ok := out[r]; !ok {
			return nil, errf(codeFailedToParse, "Missing '%s' parameter to %s", r, name)
		}
	}
	return out, nil
}

// argSpec declares the named arguments of an object-shaped operator
// argument ({input: ..., to: ...}), for namedArgs.
type argSpec struct {
	// allowed are the accepted names and required those that must be
	// present, as objArgs checks them.
	allowed, required []string
	// refused maps allowed names the server does not implement to the
	// NotImplemented message naming them; they fail before any argument is
	// compiled.
	refused map[string]string
	// compile are the arguments compiled, in this order. An allowed name
	// not listed here is accepted and ignored.
	compile []string
}

// namedArgs reads an object-shaped operator argument as spec declares it
// and compiles its arguments; an absent optional argument compiles to nil.
// It is the named-argument counterpart of nullishArgs: the operators build
// only their evaluation, whose null and error rules differ per operator.
func (p *parser) namedArgs(name string, arg any, spec *argSpec) (map[string]evalFn, error) {
	m, err := p.objArgs(name, arg, spec.allowed, spec.required...)
	if err != nil {
		return nil, err
	}
	for _, k := range spec.allowed {
		if msg, ok := spec.refused[k]; ok {
			if _, present := m[k]; present {
				return nil, errf(codeNotImplemented, "%s", msg)
			}
		}
	}
	return p.compileArgs(m, spec.compile...)
}

// compileArgs compiles the arguments of m named by keys, in that order;
// an absent one compiles to nil.
func (p *parser) compileArgs(m map[string]any, keys ...string) (map[string]evalFn, error) {
	out := make(map[string]evalFn, len(keys))
	for _, k := range keys {
		fn, err := p.optional(m, k)
		if err != nil {
			return nil, err
		}
		out[k] = fn
	}
	return out, nil
}

// optional compiles an optional argument; absent yields nil.
func (p *parser) optional(m map[string]any, key string) (evalFn, error) {
	v, ok := m[key]
	if !ok {
		return nil, nil
	}
	return p.parse(v)
}

// render formats a value for error messages in MongoDB's relaxed style.
func render(v any) string {
	switch x := v.(type) {
	case missingType:
		return "MISSING"
	case bson.D:
		b, err := bson.MarshalExtJSON(x, false, false)
		if err == nil {
			return string(b)
		}
	}
	b, err := bson.MarshalExtJSON(bson.D{{Key: "v", Value: v}}, false, false)
	if err != nil {
		return typeName(v)
	}
	s := string(b)
	s = strings.TrimPrefix(s, `{"v":`)
	return strings.TrimSuffix(s, "}")
}

func hasVar(vars bson.D, name string) bool {
	for _, e := range vars {
		if e.Key == name {
			return true
		}
	}
	return false
}

// varValue returns the value of a let variable; its last definition wins.
func varValue(vars bson.D, name string) any {
	var v any
	for _, e := range vars {
		if e.Key == name {
			v = e.Value
		}
	}
	return normalize(v)
}
