package update

import (
	"sort"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/event-outbox/outbox/mongox/internal/bsonkit"
	"github.com/event-outbox/outbox/mongox/internal/mongoerr"
	"github.com/event-outbox/outbox/mongox/internal/query"
)

// apply runs one modification on the private copy d.
func (m *mod) apply(d bson.D, opts ApplyOptions, filters map[string]*query.Matcher) (bson.D, error) {
	if m.op == "$rename" {
		return m.rename(d, filters)
	}
	w := &walker{path: m.path, filters: filters}
	switch m.op {
	case "$set", "$setOnInsert":
		w.create = true
		w.fn = func(any, bool) (any, action, error) { return bsonkit.Copy(m.arg), actSet, nil }
	case "$unset":
		w.fn = func(_ any, exists bool) (any, action, error) {
			if !exists {
				return nil, actKeep, nil
			}
			return nil, actRemove, nil
		}
	case "$inc", "$mul":
		w.create = true
		w.fn = m.arith(d)
	case "$min", "$max":
		w.create = true
		w.fn = func(cur any, exists bool) (any, action, error) {
			if !exists {
				return bsonkit.Copy(m.arg), actSet, nil
			}
			c := bsonkit.Compare(m.arg, cur)
			if (m.op == "$min" && c < 0) || (m.op == "$max" && c > 0) {
				return bsonkit.Copy(m.arg), actSet, nil
			}
			return nil, actKeep, nil
		}
	case "$currentDate":
		w.create = true
		var v any = bson.NewDateTimeFromTime(opts.Now)
		if m.timestamp {
			v = bson.Timestamp{T: uint32(opts.Now.Unix()), I: 1}
		}
		w.fn = func(any, bool) (any, action, error) { return v, actSet, nil }
	case "$push":
		w.create = true
		w.fn = m.push(d)
	case "$addToSet":
		w.create = true
		w.fn = m.addToSet(d)
	case "$pop":
		w.fn = m.pop(d)
	case "$pull", "$pullAll":
		w.fn = m.pull(d)
	default:
		return nil, newErr(CodeFailedToParse, "Unknown modifier: %s", m.op)
	}
	return w.doc(d, m.parts)
}

func (m *mod) arith(doc bson.D) leafFunc {
	return func(cur any, exists bool) (any, action, error) {
		if !exists {
			if m.op == "$mul" {
				return zeroLike(m.arg), actSet, nil
			}
			return m.arg, actSet, nil
		}
		if !bsonkit.IsNumber(cur) {
			return nil, actKeep, newErr(CodeTypeMismatch, "Cannot apply %s to a value of non-numeric type. {_id: %s} has the field '%s' of non-numeric type %s",
				m.op, idOf(doc), lastPart(m.parts), mongoerr.TypeName(cur))
		}
		r, ok := arith(cur, m.arg, m.op == "$mul")
		if !ok {
			return nil, actKeep, newErr(CodeBadValue, "Failed to apply %s operations to current value (%s) for document {_id: %s}", m.op, fmtValue(cur), idOf(doc))
		}
		return r, actSet, nil
	}
}

func idOf(doc bson.D) string {
	id, ok := bsonkit.Get(doc, "_id")
	if !ok {
		return "null"
	}
	return fmtValue(id)
}

func lastPart(parts []string) string { return parts[len(parts)-1] }

func (m *mod) push(doc bson.D) leafFunc {
	return func(cur any, exists bool) (any, action, error) {
		var arr bson.A
		if exists {
			a, ok := cur.(bson.A)
			if !ok {
				return nil, actKeep, newErr(CodeBadValue, "The field '%s' must be an array but is of type %s in document {_id: %s}", m.path, mongoerr.TypeName(cur), idOf(doc))
			}
			arr = a
		}
		items := make(bson.A, len(m.each))
		for i, v := range m.each {
			items[i] = bsonkit.Copy(v)
		}
		pos := len(arr)
		if m.position != nil {
			p := *m.position
			if p < 0 {
				p += int64(len(arr))
				if p < 0 {
					p = 0
				}
			}
			if p < int64(pos) {
				pos = int(p)
			}
		}
		out := make(bson.A, 0, len(arr)+len(items))
		out = append(out, arr[:pos]...)
		out = append(out, items...)
		out = append(out, arr[pos:]...)
		if m.sortSpec != nil {
			m.sortSpec.sort(out)
		}
		if m.slice != nil {
			n := *m.slice
			switch {
			case n >= 0 && n < int64(len(out)):
				out = out[:n]
			case n < 0 && -n < int64(len(out)):
				out = out[int64(len(out))+n:]
			}
		}
		return out, actSet, nil
	}
}

func (s *pushSort) sort(a bson.A) {
	if s.byDoc != nil {
		sort.SliceStable(a, func(i, j int) bool {
			return s.byDoc.Compare(elemDoc(a[i]), elemDoc(a[j])) < 0
		})
		return
	}
	sort.SliceStable(a, func(i, j int) bool {
		return s.dir*bsonkit.Compare(a[i], a[j]) < 0
	})
}

// elemDoc views an array element as a document for a field sort; other
// values sort as documents without the field.
func elemDoc(v any) bson.D {
	if d, ok := v.(bson.D); ok {
		return d
	}
	return bson.D{}
}

func (m *mod) addToSet(doc bson.D) leafFunc {
	return func(cur any, exists bool) (any, action, error) {
		var arr bson.A
		if exists {
			a, ok := cur.(bson.A)
			if !ok {
				return nil, actKeep, newErr(CodeBadValue, "Cannot apply $addToSet to non-array field. Field named '%s' has non-array type %s", lastPart(m.parts), mongoerr.TypeName(cur))
			}
			arr = a
		} else {
			arr = bson.A{}
		}
		changed := !exists
		for _, v := range m.each {
			dup := false
			for _, e := range arr {
				if bsonkit.Equal(e, v) {
					dup = true
					break
				}
			}
			if !dup {
				arr = append(arr, bsonkit.Copy(v))
				changed = true
			}
		}
		if !changed {
			return nil, actKeep, nil
		}
		return arr, actSet, nil
	}
}

func (m *mod) pop(doc bson.D) leafFunc {
	first := false
	if f, _ := bsonkit.ToFloat64(m.arg); f < 0 {
		first = true
	}
	return func(cur any, exists bool) (any, action, error) {
		if !exists {
			return nil, actKeep, nil
		}
		a, ok := cur.(bson.A)
		if !ok {
			return nil, actKeep, newErr(CodeTypeMismatch, "Path '%s' contains an element of non-array type '%s'", m.path, mongoerr.TypeName(cur))
		}
		if len(a) == 0 {
			return nil, actKeep, nil
		}
		if first {
			return a[1:], actSet, nil
		}
		return a[:len(a)-1], actSet, nil
	}
}

func (m *mod) pull(doc bson.D) leafFunc {
	return func(cur any, exists bool) (any, action, error) {
		if !exists {
			return nil, actKeep, nil
		}
		a, ok := cur.(bson.A)
		if !ok {
			return nil, actKeep, newErr(CodeBadValue, "Cannot apply %s to a non-array value", m.op)
		}
		out := make(bson.A, 0, len(a))
		for _, e := range a {
			if !m.pullRemoves(e) {
				out = append(out, e)
			}
		}
		if len(out) == len(a) {
			return nil, actKeep, nil
		}
		return out, actSet, nil
	}
}

func (m *mod) pullRemoves(e any) bool {
	if m.op == "$pullAll" {
		for _, v := range m.arg.(bson.A) {
			if bsonkit.Equal(e, v) {
				return true
			}
		}
		return false
	}
	if m.pullMatch == nil {
		return bsonkit.Equal(e, m.arg)
	}
	if m.pullWrap {
		return m.pullMatch.Match(bson.D{{Key: "v", Value: e}})
	}
	d, ok := e.(bson.D)
	return ok && m.pullMatch.Match(d)
}

func (m *mod) rename(d bson.D, filters map[string]*query.Matcher) (bson.D, error) {
	v, found, err := getNoArray(d, m.parts, m.path, "source")
	if err != nil || !found {
		return d, err
	}
	if _, _, err := getNoArray(d, m.toParts[:len(m.toParts)-1], m.to, "destination"); err != nil {
		return nil, err
	}
	unset := &walker{path: m.path, filters: filters, fn: func(any, bool) (any, action, error) { return nil, actRemove, nil }}
	d, err = unset.doc(d, m.parts)
	if err != nil {
		return nil, err
	}
	set := &walker{path: m.to, create: true, filters: filters, fn: func(any, bool) (any, action, error) { return v, actSet, nil }}
	return set.doc(d, m.toParts)
}
