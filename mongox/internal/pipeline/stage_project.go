package pipeline

import (
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"
)

type projKind int

const (
	pInclude projKind = iota
	pExclude
	pExpr
	pChild
)

type projField struct {
	name  string
	kind  projKind
	expr  evalFn
	child *projNode
}

// projNode is one level of a $project / $addFields / $unset tree.
type projNode struct {
	fields  []*projField
	index   map[string]*projField
	hasExpr bool // the subtree holds computed fields
}

func newProjNode() *projNode { return &projNode{index: map[string]*projField{}} }

// insert adds a leaf at a dotted path, creating intermediate nodes.
func (n *projNode) insert(path string, leaf *projField) error {
	parts := strings.Split(path, ".")
	node := n
	for i, part := range parts {
		if part == "" {
			return errf(15998, "FieldPath field names may not be empty strings.")
		}
		if strings.HasPrefix(part, "$") {
			return errf(16410, "FieldPath field names may not start with '$'. Consider using $getField or $setField.")
		}
		f := node.index[part]
		if i == len(parts)-1 {
			if f != nil {
				return errf(31250, "Invalid specification: Path collision at %s", path)
			}
			leaf.name = part
			node.fields = append(node.fields, leaf)
			node.index[part] = leaf
			return nil
		}
		if f == nil {
			f = &projField{name: part, kind: pChild, child: newProjNode()}
			node.fields = append(node.fields, f)
			node.index[part] = f
		} else if f.kind != pChild {
			return errf(31250, "Invalid specification: Path collision at %s remaining portion %s", path, strings.Join(parts[i+1:], "."))
		}
		node = f.child
	}
	return nil
}

// markExprs sets hasExpr bottom-up.
func (n *projNode) markExprs() bool {
	for _, f := range n.fields {
		switch f.kind {
		case pExpr:
			n.hasExpr = true
		case pChild:
			if f.child.markExprs() {
				n.hasExpr = true
			}
		}
	}
	return n.hasExpr
}

// isOperatorDoc reports whether a spec value is an expression object.
func isOperatorDoc(d bson.D) bool { return len(d) > 0 && strings.HasPrefix(d[0].Key, "$") }

// --- $project ---

type projectStage struct {
	root      *projNode
	inclusion bool
}

// projectBuilder collects a $project spec and tracks its mode.
type projectBuilder struct {
	p         parser
	root      *projNode
	mode      int // 0 unknown, 1 inclusion, 2 exclusion
	idSet     bool
	excludeID bool
}

func (b *projectBuilder) setMode(path string, m int) error {
	if b.mode == 0 || b.mode == m {
		b.mode = m
		return nil
	}
	if m == 2 {
		return errf(31254, "Invalid $project :: caused by :: Cannot do exclusion on field %s in inclusion projection", path)
	}
	return errf(31253, "Invalid $project :: caused by :: Cannot do inclusion on field %s in exclusion projection", path)
}

func (b *projectBuilder) add(prefix string, spec bson.D) error {
	for _, e := range spec {
		path := e.Key
		if prefix != "" {
			path = prefix + "." + e.Key
		}
		if e.Key == "" {
			return errf(40352, "Invalid $project :: caused by :: FieldPath cannot be constructed with empty string")
		}
		isID := path == "_id"
		var leaf *projField
		computed := func() error {
			if b.mode == 2 {
				return errf(31252, "Invalid $project :: caused by :: Cannot use expression other than $meta in exclusion projection")
			}
			if isID {
				b.idSet = true
			} else {
				b.mode = 1
			}
			fn, err := b.p.parse(e.Value)
			if err != nil {
				return err
			}
			leaf = &projField{kind: pExpr, expr: fn}
			return nil
		}
		switch v := e.Value.(type) {
		case bool, int32, int64, float64, bson.Decimal128:
			if truthy(v) {
				if isID {
					b.idSet = true
				} else if err := b.setMode(path, 1); err != nil {
					return err
				}
				leaf = &projField{kind: pInclude}
			} else {
				if isID {
					b.idSet, b.excludeID = true, true
				} else if err := b.setMode(path, 2); err != nil {
					return err
				}
				leaf = &projField{kind: pExclude}
			}
		case bson.D:
			if len(v) == 0 {
				return errf(51270, "Invalid $project :: caused by :: An empty sub-projection is not a valid value. Found empty object at path")
			}
			if !isOperatorDoc(v) {
				if err := b.add(path, v); err != nil {
					return err
				}
				continue
			}
			if err := computed(); err != nil {
				return err
			}
		default:
			if err := computed(); err != nil {
				return err
			}
		}
		if err := b.root.insert(path, leaf); err != nil {
			return err
		}
	}
	return nil
}

func parseProject(arg any, vars bson.D) (stage, error) {
	spec, ok := arg.(bson.D)
	if !ok {
		return nil, errf(15969, "$project specification must be an object")
	}
	if len(spec) == 0 {
		return nil, errf(51272, "Invalid $project :: caused by :: projection specification must have at least one field")
	}
	b := &projectBuilder{p: parser{vars: vars}, root: newProjNode()}
	if err := b.add("", spec); err != nil {
		return nil, err
	}
	inclusion := b.mode == 1 || (b.mode == 0 && !b.excludeID)
	if inclusion {
		if idf := b.root.index["_id"]; idf == nil {
			// _id is included unless excluded; it keeps its place in the document.
			f := &projField{name: "_id", kind: pInclude}
			b.root.fields = append([]*projField{f}, b.root.fields...)
			b.root.index["_id"] = f
		} else if idf.kind == pExclude {
			delete(b.root.index, "_id")
			b.root.fields = removeField(b.root.fields, idf)
		}
	}
	b.root.markExprs()
	return &projectStage{root: b.root, inclusion: inclusion}, nil
}

func removeField(fs []*projField, f *projField) []*projField {
	out := fs[:0:0]
	for _, x := range fs {
		if x != f {
			out = append(out, x)
		}
	}
	return out
}

func (s *projectStage) run(in []bson.D, c *ctx) ([]bson.D, error) {
	out := make([]bson.D, len(in))
	for i, d := range in {
		if !s.inclusion {
			out[i] = s.root.exclude(d)
			continue
		}
		c.reset(d)
		r := s.root.include(d)
		if s.root.hasExpr {
			var err error
			if r, err = s.root.applyExprs(r, c); err != nil {
				return nil, err
			}
			r = idFirst(r)
		}
		out[i] = r
	}
	return out, nil
}

// include keeps the included fields of d, in d's order.
func (n *projNode) include(d bson.D) bson.D {
	out := make(bson.D, 0, len(n.fields))
	for _, e := range d {
		f := n.index[e.Key]
		if f == nil {
			continue
		}
		switch f.kind {
		case pInclude:
			out = append(out, e)
		case pChild:
			if v := f.child.includeValue(e.Value); !isMissing(v) {
				out = append(out, bson.E{Key: e.Key, Value: v})
			}
		}
	}
	return out
}

func (n *projNode) includeValue(v any) any {
	switch x := v.(type) {
	case bson.D:
		return n.include(x)
	case bson.A:
		out := bson.A{}
		for _, e := range x {
			switch e.(type) {
			case bson.D, bson.A:
				if r := n.includeValue(e); !isMissing(r) {
					out = append(out, r)
				}
			}
		}
		return out
	}
	return missing
}

// applyExprs sets the computed fields of n into out (which the caller owns),
// in specification order.
func (n *projNode) applyExprs(out bson.D, c *ctx) (bson.D, error) {
	for _, f := range n.fields {
		switch {
		case f.kind == pExpr:
			v, err := f.expr(c)
			if err != nil {
				return nil, err
			}
			out = setField(out, f.name, v)
		case f.kind == pChild && f.child.hasExpr:
			v, err := f.child.exprsToValue(getField(out, f.name), c)
			if err != nil {
				return nil, err
			}
			out = setField(out, f.name, v)
		}
	}
	return out, nil
}

func (n *projNode) exprsToValue(v any, c *ctx) (any, error) {
	switch x := v.(type) {
	case bson.D:
		return n.applyExprs(append(make(bson.D, 0, len(x)+len(n.fields)), x...), c)
	case bson.A:
		out := make(bson.A, len(x))
		for i, e := range x {
			r, err := n.exprsToValue(e, c)
			if err != nil {
				return nil, err
			}
			out[i] = r
		}
		return out, nil
	}
	return n.applyExprs(bson.D{}, c)
}

// exclude drops the excluded fields of d.
func (n *projNode) exclude(d bson.D) bson.D {
	out := make(bson.D, 0, len(d))
	for _, e := range d {
		f := n.index[e.Key]
		if f == nil {
			out = append(out, e)
			continue
		}
		switch f.kind {
		case pExclude:
		case pChild:
			out = append(out, bson.E{Key: e.Key, Value: f.child.excludeValue(e.Value)})
		default:
			out = append(out, e)
		}
	}
	return out
}

func (n *projNode) excludeValue(v any) any {
	switch x := v.(type) {
	case bson.D:
		return n.exclude(x)
	case bson.A:
		out := make(bson.A, len(x))
		for i, e := range x {
			out[i] = n.excludeValue(e)
		}
		return out
	}
	return v
}

// --- $addFields / $set ---

type addFieldsStage struct{ root *projNode }

func parseAddFields(name string, arg any, vars bson.D) (stage, error) {
	spec, ok := arg.(bson.D)
	if !ok {
		return nil, errf(40272, "%s specification stage must be an object, got %s", name, typeName(arg))
	}
	root := newProjNode()
	p := parser{vars: vars}
	var add func(prefix string, spec bson.D) error
	add = func(prefix string, spec bson.D) error {
		for _, e := range spec {
			path := e.Key
			if prefix != "" {
				path = prefix + "." + e.Key
			}
			if e.Key == "" {
				return errf(40352, "Invalid %s :: caused by :: FieldPath cannot be constructed with empty string", name)
			}
			if d, ok := e.Value.(bson.D); ok && len(d) > 0 && !isOperatorDoc(d) {
				if err := add(path, d); err != nil {
					return err
				}
				continue
			}
			fn, err := p.parse(e.Value)
			if err != nil {
				return err
			}
			if err := root.insert(path, &projField{kind: pExpr, expr: fn}); err != nil {
				return err
			}
		}
		return nil
	}
	if err := add("", spec); err != nil {
		return nil, err
	}
	root.markExprs()
	return &addFieldsStage{root: root}, nil
}

func (s *addFieldsStage) run(in []bson.D, c *ctx) ([]bson.D, error) {
	out := make([]bson.D, len(in))
	for i, d := range in {
		c.reset(d)
		r, err := s.root.applyExprs(append(make(bson.D, 0, len(d)+len(s.root.fields)), d...), c)
		if err != nil {
			return nil, err
		}
		out[i] = r
	}
	return out, nil
}

// --- $unset ---

type unsetStage struct{ root *projNode }

func parseUnset(arg any, vars bson.D) (stage, error) {
	var paths []string
	switch x := arg.(type) {
	case string:
		paths = []string{x}
	case bson.A:
		if len(x) == 0 {
			return nil, errf(31119, "$unset specification must be a string or an array with at least one field")
		}
		for _, e := range x {
			s, ok := e.(string)
			if !ok {
				return nil, errf(31120, "$unset specification must be a string or an array containing only string values")
			}
			paths = append(paths, s)
		}
	default:
		return nil, errf(31002, "$unset specification must be a string or an array")
	}
	root := newProjNode()
	for _, path := range paths {
		if path == "" {
			return nil, errf(40352, "Invalid $unset :: caused by :: FieldPath cannot be constructed with empty string")
		}
		if err := root.insert(path, &projField{kind: pExclude}); err != nil {
			return nil, err
		}
	}
	return &unsetStage{root: root}, nil
}

func (s *unsetStage) run(in []bson.D, _ *ctx) ([]bson.D, error) {
	out := make([]bson.D, len(in))
	for i, d := range in {
		out[i] = s.root.exclude(d)
	}
	return out, nil
}

// idFirst moves a computed _id to the front, where MongoDB keeps it.
func idFirst(d bson.D) bson.D {
	for i := 1; i < len(d); i++ {
		if d[i].Key == "_id" {
			id := d[i]
			copy(d[1:i+1], d[:i])
			d[0] = id
			break
		}
	}
	return d
}
