package update

import (
	"strconv"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/event-outbox/outbox/mongox/internal/bsonkit"
	"github.com/event-outbox/outbox/mongox/internal/mongoerr"
	"github.com/event-outbox/outbox/mongox/internal/query"
)

// ApplyOptions are the per-operation inputs of Apply.
type ApplyOptions struct {
	// IsInsert marks the insert of an upsert: $setOnInsert applies.
	IsInsert bool
	// Now is the time $currentDate writes. Defaults to time.Now().
	Now time.Time
	// ArrayFilters are the update's arrayFilters, one document per
	// $[<identifier>] (for example {"elem.grade": {$gte: 85}}).
	ArrayFilters []bson.D
	// Query is the filter that selected the document; the positional
	// operator $ stands for the index of the array element it matched.
	Query bson.D
}

// Apply returns the updated document. It never mutates doc. For a
// replacement the result keeps doc's _id (first); for operators, fields
// keep their position and new ones are appended. Changing an existing _id
// fails with code 66 ImmutableField.
func (u *Update) Apply(doc bson.D, opts ApplyOptions) (bson.D, error) {
	if u.isRepl {
		return u.applyReplacement(doc)
	}
	if opts.Now.IsZero() {
		opts.Now = time.Now()
	}
	if u.stages != nil {
		return u.applyPipeline(doc, opts)
	}
	filters, err := u.compileFilters(opts.ArrayFilters)
	if err != nil {
		return nil, err
	}
	mods := u.mods
	if u.positional {
		if opts.IsInsert {
			return nil, newErr(CodeBadValue, "The positional operator did not find the match needed from the query.")
		}
		if mods, err = u.resolvePositional(doc, opts.Query); err != nil {
			return nil, err
		}
	}
	out := bsonkit.CopyDoc(doc)
	if out == nil {
		out = bson.D{}
	}
	oldID, hadID := bsonkit.Get(doc, "_id")
	for _, m := range mods {
		if m.op == "$setOnInsert" && !opts.IsInsert {
			continue
		}
		out, err = m.apply(out, opts, filters)
		if err != nil {
			return nil, err
		}
	}
	newID, hasID := bsonkit.Get(out, "_id")
	if hadID && (!hasID || !bsonkit.Equal(oldID, newID) || bsonkit.Rank(oldID) != bsonkit.Rank(newID)) {
		return nil, newErr(CodeImmutableField, "Performing an update on the path '_id' would modify the immutable field '_id'")
	}
	if hasID {
		if _, isArr := newID.(bson.A); isArr {
			return nil, newErr(CodeInvalidIDField, "The '_id' value cannot be of type array")
		}
		if opts.IsInsert {
			out = idFirst(out)
		}
	}
	return out, nil
}

func idFirst(d bson.D) bson.D {
	for i, e := range d {
		if e.Key == "_id" {
			if i == 0 {
				return d
			}
			out := make(bson.D, 0, len(d))
			out = append(out, e)
			out = append(out, d[:i]...)
			return append(out, d[i+1:]...)
		}
	}
	return d
}

func (u *Update) applyReplacement(doc bson.D) (bson.D, error) {
	repl := bsonkit.CopyDoc(u.replacement)
	newID, hasNew := bsonkit.Get(repl, "_id")
	oldID, hasOld := bsonkit.Get(doc, "_id")
	if hasOld {
		if hasNew && (!bsonkit.Equal(oldID, newID) || bsonkit.Rank(oldID) != bsonkit.Rank(newID)) {
			return nil, newErr(CodeImmutableField, "After applying the update, the (immutable) field '_id' was found to have been altered to _id: %s", fmtValue(newID))
		}
		out := make(bson.D, 0, len(repl)+1)
		out = append(out, bson.E{Key: "_id", Value: bsonkit.Copy(oldID)})
		for _, e := range repl {
			if e.Key != "_id" {
				out = append(out, e)
			}
		}
		return out, nil
	}
	if repl == nil {
		repl = bson.D{}
	}
	return idFirst(repl), nil
}

// compileFilters matches each arrayFilters document to its identifier.
func (u *Update) compileFilters(afs []bson.D) (map[string]*query.Matcher, error) {
	if len(afs) == 0 && len(u.identifiers) == 0 {
		return nil, nil
	}
	out := make(map[string]*query.Matcher, len(afs))
	for _, f := range afs {
		if len(f) == 0 {
			return nil, newErr(CodeFailedToParse, "Cannot use an expression without a top-level field name in arrayFilters")
		}
		id := ""
		for _, e := range f {
			name, _, _ := strings.Cut(e.Key, ".")
			if strings.HasPrefix(name, "$") {
				return nil, newErr(CodeFailedToParse, "Cannot use an expression without a top-level field name in arrayFilters")
			}
			if id == "" {
				id = name
			} else if id != name {
				return nil, newErr(CodeFailedToParse, "Error parsing array filter :: caused by :: Expected a single top-level field name, found '%s' and '%s'", id, name)
			}
		}
		if !validIdentifier(id) {
			return nil, newErr(CodeBadValue, "Error parsing array filter :: caused by :: The top-level field name must be an alphanumeric string beginning with a lowercase letter, found '%s'", id)
		}
		if _, dup := out[id]; dup {
			return nil, newErr(CodeFailedToParse, "Found multiple array filters with the same top-level field name %s", id)
		}
		m, err := query.Compile(f)
		if err != nil {
			if qe, ok := err.(*mongoerr.Error); ok {
				return nil, &mongoerr.Error{Code: qe.Code, CodeName: qe.CodeName, Msg: "Error parsing array filter :: caused by :: " + qe.Msg}
			}
			return nil, newErr(CodeBadValue, "Error parsing array filter :: caused by :: %v", err)
		}
		out[id] = m
	}
	for id := range u.identifiers {
		if out[id] == nil {
			return nil, newErr(CodeBadValue, "No array filter found for identifier '%s'", id)
		}
	}
	for id := range out {
		if !u.identifiers[id] {
			return nil, newErr(CodeFailedToParse, "The array filter for identifier '%s' was not used in the update", id)
		}
	}
	return out, nil
}

// maxBackfill is how many nulls MongoDB pads an array with at most.
const maxBackfill = 1_500_000

// action is what a leaf function decided.
type action int

const (
	actKeep action = iota
	actSet
	actRemove
)

// leafFunc computes the new value at the end of a path.
type leafFunc func(cur any, exists bool) (any, action, error)

// walker applies a leaf function at a path, creating missing documents
// when create is set. The document it walks is the private copy made by
// Apply, so it modifies in place.
type walker struct {
	create  bool
	path    string
	fn      leafFunc
	filters map[string]*query.Matcher
}

func (w *walker) doc(d bson.D, parts []string) (bson.D, error) {
	p := parts[0]
	if _, ok := filterIdentifier(p); ok {
		return nil, newErr(CodeBadValue, "Cannot apply array updates to non-array element %s", fmtValue(d))
	}
	idx := -1
	for i := range d {
		if d[i].Key == p {
			idx = i
			break
		}
	}
	if len(parts) == 1 {
		var cur any
		if idx >= 0 {
			cur = d[idx].Value
		}
		nv, act, err := w.fn(cur, idx >= 0)
		if err != nil {
			return nil, err
		}
		switch {
		case act == actSet && idx >= 0:
			d[idx].Value = nv
		case act == actSet:
			d = append(d, bson.E{Key: p, Value: nv})
		case act == actRemove && idx >= 0:
			d = append(d[:idx], d[idx+1:]...)
		}
		return d, nil
	}
	if idx < 0 {
		if !w.create {
			return d, nil
		}
		if _, ok := filterIdentifier(parts[1]); ok {
			return nil, newErr(CodeBadValue, "The path '%s' must exist in the document in order to apply array updates.", strings.Join(pathPrefix(w.path, parts), "."))
		}
		child, err := w.doc(bson.D{}, parts[1:])
		if err != nil {
			return nil, err
		}
		return append(d, bson.E{Key: p, Value: child}), nil
	}
	nv, err := w.descend(p, d[idx].Value, parts[1:])
	if err != nil {
		return nil, err
	}
	d[idx].Value = nv
	return d, nil
}

// pathPrefix returns the components of full up to and including the
// component that precedes rest's second element (the current field).
func pathPrefix(full string, parts []string) []string {
	all := strings.Split(full, ".")
	n := len(all) - len(parts) + 1
	if n < 0 || n > len(all) {
		return all
	}
	return all[:n]
}

// descend continues the walk into the value v of field name.
func (w *walker) descend(name string, v any, rest []string) (any, error) {
	switch c := v.(type) {
	case bson.D:
		return w.doc(c, rest)
	case bson.A:
		return w.arr(name, c, rest)
	}
	if !w.create {
		return v, nil
	}
	if _, ok := filterIdentifier(rest[0]); ok {
		return nil, newErr(CodeBadValue, "Cannot apply array updates to non-array element %s: %s", name, fmtValue(v))
	}
	return nil, newErr(CodePathNotViable, "Cannot create field '%s' in element {%s: %s}", rest[0], name, fmtValue(v))
}

func (w *walker) arr(name string, a bson.A, parts []string) (bson.A, error) {
	p := parts[0]
	if id, ok := filterIdentifier(p); ok {
		var m *query.Matcher
		if id != "" {
			m = w.filters[id]
			if m == nil {
				return nil, newErr(CodeBadValue, "No array filter found for identifier '%s' in path '%s'", id, w.path)
			}
		}
		for i := range a {
			if m != nil && !m.Match(bson.D{{Key: id, Value: a[i]}}) {
				continue
			}
			if err := w.element(name, a, i, parts[1:]); err != nil {
				return nil, err
			}
		}
		return a, nil
	}
	i, ok := arrayIndex(p)
	if !ok {
		if !w.create {
			return a, nil
		}
		return nil, newErr(CodePathNotViable, "Cannot create field '%s' in element {%s: %s}", p, name, fmtValue(a))
	}
	if i >= len(a) {
		if !w.create {
			return a, nil
		}
		if i-len(a) > maxBackfill {
			return nil, newErr(CodeBadValue, "can't backfill array to larger than 1,500,000 elements (path '%s')", w.path)
		}
		var nv any
		if len(parts) == 1 {
			v, act, err := w.fn(nil, false)
			if err != nil {
				return nil, err
			}
			if act != actSet {
				return a, nil
			}
			nv = v
		} else {
			child, err := w.doc(bson.D{}, parts[1:])
			if err != nil {
				return nil, err
			}
			nv = child
		}
		for len(a) < i {
			a = append(a, nil)
		}
		return append(a, nv), nil
	}
	if err := w.element(name, a, i, parts[1:]); err != nil {
		return nil, err
	}
	return a, nil
}

// element applies the rest of the path to element i of a, in place.
func (w *walker) element(name string, a bson.A, i int, rest []string) error {
	if len(rest) == 0 {
		nv, act, err := w.fn(a[i], true)
		if err != nil {
			return err
		}
		switch act {
		case actSet:
			a[i] = nv
		case actRemove:
			a[i] = nil // $unset of an array element leaves null
		}
		return nil
	}
	nv, err := w.descend(name+"."+strconv.Itoa(i), a[i], rest)
	if err != nil {
		return err
	}
	a[i] = nv
	return nil
}

// getNoArray reads a path that must not pass through arrays ($rename).
// It returns found false when the path does not exist and err when it
// would need to traverse an array.
func getNoArray(d bson.D, parts []string, path, role string) (any, bool, error) {
	var cur any = d
	for i, p := range parts {
		switch c := cur.(type) {
		case bson.D:
			v, ok := bsonkit.Get(c, p)
			if !ok {
				return nil, false, nil
			}
			cur = v
		case bson.A:
			return nil, false, newErr(CodeBadValue, "The %s field cannot be an array element, '%s' in doc with %s has an array field called '%s'",
				role, path, fmtValue(d), strings.Join(parts[:i], "."))
		default:
			return nil, false, nil
		}
	}
	return cur, true, nil
}
