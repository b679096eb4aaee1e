package query

import (
	"strings"
	"sync/atomic"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// maxDepth bounds the nesting of logical operators and $elemMatch, as
// MongoDB does.
const maxDepth = 100

// Matcher is a compiled query filter. It is immutable and safe for
// concurrent use.
type Matcher struct {
	root node
}

// Compile parses a MongoDB query filter. Invalid filters and operators this
// server does not implement return an *mongoerr.Error naming the operator.
func Compile(filter bson.D) (*Matcher, error) {
	return CompileWithVars(filter, nil)
}

// CompileWithVars is Compile with variables ($$name) visible to $expr: the
// let parameters of a command, already evaluated, in order.
func CompileWithVars(filter bson.D, vars bson.D) (*Matcher, error) {
	n, err := compileDoc(filter, level{vars: vars})
	if err != nil {
		return nil, err
	}
	return &Matcher{root: n}, nil
}

// Match reports whether doc satisfies the filter. A nil Matcher matches
// every document.
func (m *Matcher) Match(doc bson.D) bool {
	if m == nil || m.root == nil {
		return true
	}
	return m.root.match(doc)
}

// ExprCompiler compiles the argument of $expr into a predicate over a
// document; vars are the variables in scope (let parameters). The
// aggregation package installs one with SetExprCompiler (this package cannot
// import it: the aggregation $match stage imports query).
type ExprCompiler func(expr any, vars bson.D) (func(doc bson.D) bool, error)

// level is the compile state passed down a filter: the nesting depth and
// the variables visible to $expr.
type level struct {
	n    int
	vars bson.D
}

func (l level) next() level { return level{n: l.n + 1, vars: l.vars} }

var exprCompiler atomic.Pointer[ExprCompiler]

// SetExprCompiler installs the evaluator used for $expr. Without one, $expr
// fails to compile with a NotImplemented error.
func SetExprCompiler(c ExprCompiler) {
	if c == nil {
		exprCompiler.Store(nil)
		return
	}
	exprCompiler.Store(&c)
}

// node is one compiled piece of a filter.
type node interface {
	match(doc bson.D) bool
}

type andNode []node

func (n andNode) match(doc bson.D) bool {
	for _, c := range n {
		if !c.match(doc) {
			return false
		}
	}
	return true
}

type orNode []node

func (n orNode) match(doc bson.D) bool {
	for _, c := range n {
		if c.match(doc) {
			return true
		}
	}
	return false
}

type notNode struct{ n node }

func (n notNode) match(doc bson.D) bool { return !n.n.match(doc) }

type constNode bool

func (n constNode) match(bson.D) bool { return bool(n) }

type funcNode func(bson.D) bool

func (n funcNode) match(doc bson.D) bool { return n(doc) }

// pathNode applies a predicate to the values a path resolves to. With
// expand, a leaf array also offers each of its elements.
type pathNode struct {
	parts  []string
	pred   pred
	expand bool
}

func (n *pathNode) match(doc bson.D) bool { return walkDoc(doc, n.parts, n) }

func (n *pathNode) leaf(v any) bool {
	if n.pred.test(v) {
		return true
	}
	if n.expand {
		if arr, ok := asArr(v); ok {
			for _, e := range arr {
				if n.pred.test(e) {
					return true
				}
			}
		}
	}
	return false
}

func andOf(nodes []node) node {
	switch len(nodes) {
	case 0:
		return constNode(true)
	case 1:
		return nodes[0]
	}
	return andNode(nodes)
}

// compileDoc compiles a filter document: the AND of its fields.
func compileDoc(filter bson.D, depth level) (node, error) {
	if depth.n > maxDepth {
		return nil, badValue("exceeded depth limit of %d when parsing match expression", maxDepth)
	}
	nodes := make([]node, 0, len(filter))
	for _, e := range filter {
		n, err := compileTop(e, depth)
		if err != nil {
			return nil, err
		}
		if n != nil {
			nodes = append(nodes, n)
		}
	}
	return andOf(nodes), nil
}

func compileTop(e bson.E, depth level) (node, error) {
	if !strings.HasPrefix(e.Key, "$") {
		return compileField(e.Key, e.Value, depth)
	}
	switch e.Key {
	case "$and", "$or", "$nor":
		return compileLogical(e.Key, e.Value, depth)
	case "$comment":
		return nil, nil
	case "$alwaysTrue", "$alwaysFalse":
		if n, ok := numberValue(e.Value); !ok || n != 1 {
			return nil, badValue("%s must be an integer value of 1", e.Key)
		}
		return constNode(e.Key == "$alwaysTrue"), nil
	case "$expr":
		c := exprCompiler.Load()
		if c == nil {
			return nil, unsupported("$expr")
		}
		f, err := (*c)(e.Value, depth.vars)
		if err != nil {
			return nil, err
		}
		return funcNode(f), nil
	case "$text":
		// mongod's answer on a collection without a text index; the
		// embedded server creates none (mongofake refuses text indexes).
		return nil, newErr(27, "text index required for $text query (the embedded server supports no text indexes)")
	case "$where", "$jsonSchema", "$sampleRate", "$atomic", "$isolated":
		return nil, unsupported("query operator " + e.Key)
	}
	return nil, badValue("unknown top level operator: %s. If you have a field name that starts with a '$' symbol, consider using $getField or $setField.", e.Key)
}

func compileLogical(op string, v any, depth level) (node, error) {
	arr, ok := asArr(v)
	if !ok {
		return nil, badValue("%s must be an array", op)
	}
	if len(arr) == 0 {
		return nil, badValue("$and/$or/$nor must be a nonempty array")
	}
	nodes := make([]node, 0, len(arr))
	for _, el := range arr {
		d, ok := asDoc(el)
		if !ok {
			return nil, badValue("$or/$and/$nor entries need to be full objects")
		}
		n, err := compileDoc(d, depth.next())
		if err != nil {
			return nil, err
		}
		nodes = append(nodes, n)
	}
	switch op {
	case "$and":
		return andOf(nodes), nil
	case "$or":
		if len(nodes) == 1 {
			return nodes[0], nil
		}
		return orNode(nodes), nil
	}
	return notNode{orNode(nodes)}, nil
}

// isOperatorDoc reports whether v is a document of query operators (its
// first key starts with '$' and it is not a DBRef).
func isOperatorDoc(v any) (bson.D, bool) {
	d, ok := asDoc(v)
	if !ok || len(d) == 0 || !strings.HasPrefix(d[0].Key, "$") {
		return nil, false
	}
	switch d[0].Key {
	case "$ref", "$id", "$db":
		return nil, false
	}
	return d, true
}

func compileField(path string, v any, depth level) (node, error) {
	parts := splitPath(path)
	if ops, ok := isOperatorDoc(v); ok {
		list, err := compileOps(ops, depth)
		if err != nil {
			return nil, err
		}
		nodes := make([]node, 0, len(list))
		for _, o := range list {
			nodes = append(nodes, o.node(parts))
		}
		return andOf(nodes), nil
	}
	if re, ok := v.(bson.Regex); ok {
		p, err := newRegexPred(re.Pattern, re.Options)
		if err != nil {
			return nil, err
		}
		return &pathNode{parts: parts, pred: p, expand: true}, nil
	}
	return &pathNode{parts: parts, pred: newEqPred(v), expand: true}, nil
}

// opKind distinguishes the shapes of compiled field operators.
type opKind uint8

const (
	opPred opKind = iota // a predicate on the path's values
	opNot                // NOT of the AND of subs ($ne, $nin, $not, $exists:false)
	opAll                // AND of subs ($all); empty matches nothing
)

// op is one compiled field operator, usable both on a path (node) and on a
// single value ($elemMatch on values).
type op struct {
	kind   opKind
	pred   pred
	expand bool
	subs   []op
}

func (o op) node(parts []string) node {
	switch o.kind {
	case opNot:
		nodes := make([]node, 0, len(o.subs))
		for _, s := range o.subs {
			nodes = append(nodes, s.node(parts))
		}
		return notNode{andOf(nodes)}
	case opAll:
		if len(o.subs) == 0 {
			return constNode(false)
		}
		nodes := make([]node, 0, len(o.subs))
		for _, s := range o.subs {
			nodes = append(nodes, s.node(parts))
		}
		return andOf(nodes)
	}
	return &pathNode{parts: parts, pred: o.pred, expand: o.expand}
}

// single applies the operator to one value without array expansion, as
// $elemMatch does for each array element.
func (o op) single(v any) bool {
	switch o.kind {
	case opNot:
		for _, s := range o.subs {
			if !s.single(v) {
				return true
			}
		}
		return false
	case opAll:
		if len(o.subs) == 0 {
			return false
		}
		for _, s := range o.subs {
			if !s.single(v) {
				return false
			}
		}
		return true
	}
	return o.pred.test(v)
}

func predOp(p pred, expand bool) op { return op{kind: opPred, pred: p, expand: expand} }

// compileOps compiles an operator document such as {$gt: 1, $lt: 5}.
func compileOps(ops bson.D, depth level) ([]op, error) {
	if depth.n > maxDepth {
		return nil, badValue("exceeded depth limit of %d when parsing match expression", maxDepth)
	}
	var (
		regexVal   any
		regexSeen  bool
		optionsVal any
		optSeen    bool
	)
	for _, e := range ops {
		switch e.Key {
		case "$regex":
			regexVal, regexSeen = e.Value, true
		case "$options":
			optionsVal, optSeen = e.Value, true
		}
	}
	if optSeen && !regexSeen {
		return nil, badValue("$options needs a $regex")
	}
	out := make([]op, 0, len(ops))
	for _, e := range ops {
		switch e.Key {
		case "$options":
			continue
		case "$regex":
			p, err := regexFromOps(regexVal, optionsVal, optSeen)
			if err != nil {
				return nil, err
			}
			out = append(out, predOp(p, true))
			continue
		}
		o, err := compileOp(e.Key, e.Value, depth)
		if err != nil {
			return nil, err
		}
		out = append(out, o)
	}
	return out, nil
}

func compileOp(name string, v any, depth level) (op, error) {
	switch name {
	case "$eq":
		return predOp(newEqPred(v), true), nil
	case "$ne":
		return op{kind: opNot, subs: []op{predOp(newEqPred(v), true)}}, nil
	case "$gt", "$gte", "$lt", "$lte":
		return predOp(newCmpPred(name, v), true), nil
	case "$in", "$nin":
		p, err := newInPred(name, v)
		if err != nil {
			return op{}, err
		}
		o := predOp(p, true)
		if name == "$nin" {
			return op{kind: opNot, subs: []op{o}}, nil
		}
		return o, nil
	case "$exists":
		o := predOp(existsPred{}, false)
		if truthy(v) {
			return o, nil
		}
		return op{kind: opNot, subs: []op{o}}, nil
	case "$type":
		p, err := newTypePred(v)
		if err != nil {
			return op{}, err
		}
		return predOp(p, true), nil
	case "$size":
		p, err := newSizePred(v)
		if err != nil {
			return op{}, err
		}
		return predOp(p, false), nil
	case "$mod":
		p, err := newModPred(v)
		if err != nil {
			return op{}, err
		}
		return predOp(p, true), nil
	case "$all":
		return compileAll(v, depth)
	case "$elemMatch":
		p, err := newElemMatchPred(v, depth)
		if err != nil {
			return op{}, err
		}
		return predOp(p, false), nil
	case "$not":
		return compileNot(v, depth)
	case "$bitsAllSet", "$bitsAnySet", "$bitsAllClear", "$bitsAnyClear":
		p, err := newBitsPred(name, v)
		if err != nil {
			return op{}, err
		}
		return predOp(p, true), nil
	case "$near", "$nearSphere", "$geoWithin", "$geoIntersects", "$within", "$maxDistance", "$minDistance",
		"$text", "$where", "$jsonSchema", "$expr":
		return op{}, unsupported("query operator " + name)
	}
	return op{}, badValue("unknown operator: %s", name)
}

func compileNot(v any, depth level) (op, error) {
	if re, ok := v.(bson.Regex); ok {
		p, err := newRegexPred(re.Pattern, re.Options)
		if err != nil {
			return op{}, err
		}
		return op{kind: opNot, subs: []op{predOp(p, true)}}, nil
	}
	d, ok := asDoc(v)
	if !ok {
		return op{}, badValue("$not needs a regex or a document")
	}
	if len(d) == 0 {
		return op{}, badValue("$not cannot be empty")
	}
	if !strings.HasPrefix(d[0].Key, "$") {
		return op{}, badValue("unknown operator: %s", d[0].Key)
	}
	subs, err := compileOps(d, depth.next())
	if err != nil {
		return op{}, err
	}
	return op{kind: opNot, subs: subs}, nil
}

func compileAll(v any, depth level) (op, error) {
	arr, ok := asArr(v)
	if !ok {
		return op{}, badValue("$all needs an array")
	}
	subs := make([]op, 0, len(arr))
	elemMatch := 0
	for _, el := range arr {
		if d, ok := isOperatorDoc(el); ok {
			if d[0].Key != "$elemMatch" || len(d) != 1 {
				return op{}, badValue("no $ expressions in $all")
			}
			p, err := newElemMatchPred(d[0].Value, depth)
			if err != nil {
				return op{}, err
			}
			subs = append(subs, predOp(p, false))
			elemMatch++
			continue
		}
		if re, ok := el.(bson.Regex); ok {
			p, err := newRegexPred(re.Pattern, re.Options)
			if err != nil {
				return op{}, err
			}
			subs = append(subs, predOp(p, true))
			continue
		}
		subs = append(subs, predOp(newEqPred(el), true))
	}
	if elemMatch != 0 && elemMatch != len(arr) {
		return op{}, badValue("$all/$elemMatch has to be consistent")
	}
	return op{kind: opAll, subs: subs}, nil
}

// truthy interprets $exists-style flags: false, 0 and null are false.
func truthy(v any) bool {
	switch x := v.(type) {
	case bool:
		return x
	case nil, bson.Null, bson.Undefined:
		return false
	}
	if f, ok := numberValue(v); ok {
		return f != 0
	}
	return true
}
