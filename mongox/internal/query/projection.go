package query

import (
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// Projection is a compiled find projection. It is immutable and safe for
// concurrent use.
type Projection struct {
	root      *projNode
	inclusion bool
	empty     bool
}

// projNode is one level of the projection tree. A node is either a leaf
// (include, exclude, slice or elemMatch) or has children.
type projNode struct {
	children  map[string]*projNode
	include   bool
	exclude   bool
	slice     *sliceSpec
	elemMatch pred
}

func (n *projNode) isLeaf() bool {
	return n.include || n.exclude || n.slice != nil || n.elemMatch != nil
}

type sliceSpec struct {
	skip     int64
	limit    int64
	hasRange bool // [skip, limit] form
}

// CompileProjection parses a find projection: inclusion ({a: 1, "b.c": 1})
// or exclusion ({a: 0}) — not mixed, except that _id may be excluded from an
// inclusion (and is included by default) — with $slice and $elemMatch
// operators. Nested documents ({a: {b: 1}}) mean the same as dotted paths.
// Aggregation expressions, $meta and the positional operator (a.$) are not
// supported and fail with NotImplemented.
func CompileProjection(spec bson.D) (*Projection, error) {
	p := &Projection{root: &projNode{}}
	if len(spec) == 0 {
		p.empty = true
		return p, nil
	}
	c := &projCompiler{p: p}
	if err := c.doc("", spec); err != nil {
		return nil, err
	}
	idInclude := false
	if id, ok := p.root.children["_id"]; ok && id.include {
		idInclude = true
	}
	p.inclusion = c.mode == modeInclusion || (c.mode == modeNone && idInclude)
	return p, nil
}

const (
	modeNone = iota
	modeInclusion
	modeExclusion
)

type projCompiler struct {
	p    *Projection
	mode int
}

func (c *projCompiler) doc(prefix string, spec bson.D) error {
	for _, e := range spec {
		path := e.Key
		if prefix != "" {
			path = prefix + "." + e.Key
		}
		if err := c.field(path, e.Value); err != nil {
			return err
		}
	}
	return nil
}

func (c *projCompiler) setMode(path string, incl bool) error {
	if path == "_id" {
		return nil
	}
	switch {
	case c.mode == modeInclusion && !incl:
		return newErr(CodeExclusionInInc, "Cannot do exclusion on field %s in inclusion projection", path)
	case c.mode == modeExclusion && incl:
		return newErr(CodeInclusionInExc, "Cannot do inclusion on field %s in exclusion projection", path)
	case incl:
		c.mode = modeInclusion
	default:
		c.mode = modeExclusion
	}
	return nil
}

func (c *projCompiler) field(path string, v any) error {
	if path == "" || strings.HasPrefix(path, ".") || strings.HasSuffix(path, ".") || strings.Contains(path, "..") {
		return badValue("projection field path %q is invalid", path)
	}
	for _, part := range strings.Split(path, ".") {
		if part == "$" {
			return unsupported("positional projection operator (" + path + ")")
		}
		if strings.HasPrefix(part, "$") {
			return newErr(16410, "FieldPath field names may not start with '$'. Consider using $getField or $setField.")
		}
	}
	switch x := v.(type) {
	case bool:
		return c.leaf(path, &projNode{include: x, exclude: !x}, x)
	case bson.D, bson.M:
		spec, _ := asDoc(x)
		if len(spec) == 0 {
			return badValue("An empty sub-projection is not a valid value. Found empty object at path %s", path)
		}
		if !strings.HasPrefix(spec[0].Key, "$") {
			return c.doc(path, spec)
		}
		if len(spec) != 1 {
			return unsupported("projection expression at field " + path)
		}
		switch spec[0].Key {
		case "$slice":
			s, err := parseSlice(spec[0].Value)
			if err != nil {
				return err
			}
			return c.place(path, &projNode{slice: s})
		case "$elemMatch":
			if strings.Contains(path, ".") {
				return badValue("Cannot use $elemMatch projection on a nested field.")
			}
			em, err := newElemMatchPred(spec[0].Value, level{})
			if err != nil {
				return err
			}
			return c.leaf(path, &projNode{elemMatch: em}, true)
		case "$meta":
			return unsupported("$meta projection")
		}
		return unsupported("projection expression " + spec[0].Key + " at field " + path)
	}
	if f, ok := numberValue(v); ok {
		incl := f != 0
		return c.leaf(path, &projNode{include: incl, exclude: !incl}, incl)
	}
	return unsupported("projection expression at field " + path)
}

func (c *projCompiler) leaf(path string, n *projNode, incl bool) error {
	if err := c.setMode(path, incl); err != nil {
		return err
	}
	return c.place(path, n)
}

// place inserts a leaf into the tree, rejecting paths that collide with
// one another (a and a.b).
func (c *projCompiler) place(path string, leaf *projNode) error {
	parts := strings.Split(path, ".")
	cur := c.p.root
	for i, part := range parts {
		if cur.children == nil {
			cur.children = map[string]*projNode{}
		}
		next, ok := cur.children[part]
		if i == len(parts)-1 {
			if ok {
				return newErr(CodePathCollision, "Path collision at %s", path)
			}
			cur.children[part] = leaf
			return nil
		}
		if !ok {
			next = &projNode{}
			cur.children[part] = next
		} else if next.isLeaf() {
			return newErr(CodePathCollision, "Path collision at %s remaining portion %s",
				path, strings.Join(parts[i+1:], "."))
		}
		cur = next
	}
	return nil
}

func parseSlice(v any) (*sliceSpec, error) {
	if arr, ok := asArr(v); ok {
		if len(arr) != 2 {
			return nil, badValue("$slice array argument must be of the form [skip, limit]")
		}
		skip, ok1 := truncInt(arr[0])
		limit, ok2 := truncInt(arr[1])
		if !ok1 || !ok2 {
			return nil, badValue("$slice array arguments must be numbers")
		}
		if limit <= 0 {
			return nil, badValue("$slice limit must be positive")
		}
		return &sliceSpec{skip: skip, limit: limit, hasRange: true}, nil
	}
	n, ok := truncInt(v)
	if !ok {
		return nil, badValue("$slice only supports numbers and [skip, limit] arrays")
	}
	return &sliceSpec{limit: n}, nil
}

func (s *sliceSpec) apply(v any) any {
	arr, ok := asArr(v)
	if !ok {
		return v
	}
	n := int64(len(arr))
	var start, end int64
	if s.hasRange {
		start = s.skip
		if start < 0 {
			start = max(n+start, 0)
		}
		start = min(start, n)
		end = min(start+s.limit, n)
		if s.limit > n {
			end = n
		}
	} else if s.limit >= 0 {
		start, end = 0, min(s.limit, n)
	} else {
		start, end = max(n+s.limit, 0), n
	}
	return append(bson.A(nil), arr[start:end]...)
}

// Apply projects doc. It never modifies doc; the result may share
// unmodified values (subdocuments, arrays) with it.
func (p *Projection) Apply(doc bson.D) bson.D {
	if p == nil || p.empty {
		return doc
	}
	if p.inclusion {
		return p.root.applyIncl(doc, true)
	}
	return p.root.applyExcl(doc)
}

func (n *projNode) applyIncl(doc bson.D, top bool) bson.D {
	out := make(bson.D, 0, len(n.children)+1)
	for _, e := range doc {
		child := n.children[e.Key]
		if child == nil {
			if top && e.Key == "_id" {
				out = append(out, e)
			}
			continue
		}
		switch {
		case child.exclude:
		case child.include:
			out = append(out, e)
		case child.slice != nil:
			out = append(out, bson.E{Key: e.Key, Value: child.slice.apply(e.Value)})
		case child.elemMatch != nil:
			arr, ok := asArr(e.Value)
			if !ok {
				continue
			}
			for _, el := range arr {
				if child.elemMatch.test(bson.A{el}) {
					out = append(out, bson.E{Key: e.Key, Value: bson.A{el}})
					break
				}
			}
		default:
			switch v := e.Value.(type) {
			case bson.D:
				out = append(out, bson.E{Key: e.Key, Value: child.applyIncl(v, false)})
			case bson.A:
				out = append(out, bson.E{Key: e.Key, Value: child.arrayIncl(v)})
			}
		}
	}
	return out
}

func (n *projNode) arrayIncl(arr bson.A) bson.A {
	out := make(bson.A, 0, len(arr))
	for _, el := range arr {
		switch v := el.(type) {
		case bson.D:
			out = append(out, n.applyIncl(v, false))
		case bson.A:
			out = append(out, n.arrayIncl(v))
		}
	}
	return out
}

func (n *projNode) applyExcl(doc bson.D) bson.D {
	out := make(bson.D, 0, len(doc))
	for _, e := range doc {
		child := n.children[e.Key]
		switch {
		case child == nil, child.include:
			out = append(out, e)
		case child.exclude:
		case child.slice != nil:
			out = append(out, bson.E{Key: e.Key, Value: child.slice.apply(e.Value)})
		default:
			switch v := e.Value.(type) {
			case bson.D:
				out = append(out, bson.E{Key: e.Key, Value: child.applyExcl(v)})
			case bson.A:
				out = append(out, bson.E{Key: e.Key, Value: child.arrayExcl(v)})
			default:
				out = append(out, e)
			}
		}
	}
	return out
}

func (n *projNode) arrayExcl(arr bson.A) bson.A {
	out := make(bson.A, 0, len(arr))
	for _, el := range arr {
		switch v := el.(type) {
		case bson.D:
			out = append(out, n.applyExcl(v))
		case bson.A:
			out = append(out, n.arrayExcl(v))
		default:
			out = append(out, el)
		}
	}
	return out
}
