package update

import (
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/event-outbox/outbox/mongox/internal/bsonkit"
	"github.com/event-outbox/outbox/mongox/internal/mongoerr"
	"github.com/event-outbox/outbox/mongox/internal/query"
)

// Update is a parsed update: a replacement document or a list of operator
// modifications. It is immutable after Parse and safe for concurrent use.
type Update struct {
	replacement bson.D // set for replacement updates
	isRepl      bool
	stages      bson.A // set for pipeline-style updates
	vars        bson.D // let parameters visible to the pipeline
	mods        []*mod // in application order
	// identifiers lists the $[<identifier>] names used in paths.
	identifiers map[string]bool
	// positional is set when a path uses the positional operator $.
	positional bool
}

// mod is one field of one operator, e.g. {$inc: {"a.b": 1}}.
type mod struct {
	op    string
	path  string
	parts []string
	arg   any

	// $push / $addToSet
	each     bson.A
	slice    *int64
	sortSpec *pushSort
	position *int64

	// $rename
	to      string
	toParts []string

	// $currentDate
	timestamp bool

	// $pull with a condition
	pullMatch *query.Matcher
	pullWrap  bool // match {"v": element} rather than the element document
}

// pushSort is the $sort modifier of $push.
type pushSort struct {
	dir   int         // 1 or -1 when sorting whole elements
	byDoc *query.Sort // when sorting by fields of document elements
}

// IsReplacement reports whether the update is a replacement document.
func (u *Update) IsReplacement() bool { return u.isRepl }

// Parse parses an update: a replacement document (no top-level $-keys) or
// an operator document ({$set: {...}, $inc: {...}}). An empty document is a
// replacement that keeps only _id, as on MongoDB. An array is a
// pipeline-style update: $addFields/$set, $project/$unset and
// $replaceRoot/$replaceWith stages.
func Parse(u any) (*Update, error) {
	return ParseWithVars(u, nil)
}

// ParseWithVars is Parse with user variables (a command's let parameters,
// already evaluated) visible as $$name in a pipeline-style update.
func ParseWithVars(u any, vars bson.D) (*Update, error) {
	var d bson.D
	switch x := u.(type) {
	case bson.D:
		d = x
	case bson.M, bson.Raw:
		d = bsonkit.AsDoc(x)
		if d == nil {
			d = bson.D{}
		}
	case bson.A:
		return parsePipeline(x, vars)
	case []any:
		return parsePipeline(bson.A(x), vars)
	default:
		return nil, newErr(CodeFailedToParse, "Update argument must be either an object or an array, found type %s", mongoerr.TypeName(u))
	}
	if len(d) == 0 || !strings.HasPrefix(d[0].Key, "$") {
		for _, e := range d {
			if strings.HasPrefix(e.Key, "$") {
				return nil, newErr(CodeDollarPrefixedFieldName,
					"The dollar ($) prefixed field '%s' in '%s' is not allowed in the context of an update's replacement document. Consider using an aggregation pipeline with $replaceWith.", e.Key, e.Key)
			}
		}
		if id, ok := bsonkit.Get(d, "_id"); ok {
			if _, isArr := id.(bson.A); isArr {
				return nil, newErr(CodeInvalidIDField, "The '_id' value cannot be of type array")
			}
		}
		return &Update{replacement: d, isRepl: true}, nil
	}
	up := &Update{identifiers: map[string]bool{}}
	for _, e := range d {
		if !strings.HasPrefix(e.Key, "$") {
			return nil, newErr(CodeFailedToParse, "Unknown modifier: %s. Expected a valid update modifier or pipeline-style update specified as an array", e.Key)
		}
		if !knownOps[e.Key] {
			return nil, newErr(CodeFailedToParse, "Unknown modifier: %s. Expected a valid update modifier or pipeline-style update specified as an array", e.Key)
		}
		fields, ok := e.Value.(bson.D)
		if !ok {
			if m, isM := e.Value.(bson.M); isM {
				fields = bsonkit.AsDoc(m)
			} else {
				return nil, newErr(CodeFailedToParse, "Modifiers operate on fields but we found type %s instead. For example: {$mod: {<field>: ...}} not {%s: %s}", mongoerr.TypeName(e.Value), e.Key, fmtValue(e.Value))
			}
		}
		for _, f := range fields {
			m, err := parseMod(e.Key, f)
			if err != nil {
				return nil, err
			}
			up.mods = append(up.mods, m)
		}
	}
	if err := up.checkConflicts(); err != nil {
		return nil, err
	}
	for _, m := range up.mods {
		for _, parts := range [][]string{m.parts, m.toParts} {
			for _, p := range parts {
				if id, ok := filterIdentifier(p); ok && id != "" {
					up.identifiers[id] = true
				}
				if p == "$" {
					up.positional = true
				}
			}
		}
	}
	sort.SliceStable(up.mods, func(i, j int) bool {
		return comparePaths(up.mods[i].orderParts(), up.mods[j].orderParts()) < 0
	})
	return up, nil
}

var knownOps = map[string]bool{
	"$set": true, "$unset": true, "$inc": true, "$mul": true, "$min": true, "$max": true,
	"$rename": true, "$setOnInsert": true, "$currentDate": true, "$push": true,
	"$addToSet": true, "$pull": true, "$pullAll": true, "$pop": true,
}

// orderParts is the path whose position decides when the mod is applied.
func (m *mod) orderParts() []string {
	if m.op == "$rename" {
		return m.toParts
	}
	return m.parts
}

// comparePaths orders paths component by component: numeric components
// numerically, others as strings; a prefix sorts first.
func comparePaths(a, b []string) int {
	for i := 0; i < len(a) && i < len(b); i++ {
		if c := compareComponent(a[i], b[i]); c != 0 {
			return c
		}
	}
	return len(a) - len(b)
}

func compareComponent(a, b string) int {
	ai, aok := arrayIndex(a)
	bi, bok := arrayIndex(b)
	if aok && bok {
		return ai - bi
	}
	return strings.Compare(a, b)
}

// arrayIndex parses a path component used as an array index: decimal
// digits without a sign.
func arrayIndex(p string) (int, bool) {
	if p == "" || len(p) > 9 {
		return 0, false
	}
	for i := 0; i < len(p); i++ {
		if p[i] < '0' || p[i] > '9' {
			return 0, false
		}
	}
	n, err := strconv.Atoi(p)
	return n, err == nil
}

// filterIdentifier recognises $[] (identifier "") and $[<identifier>].
func filterIdentifier(p string) (string, bool) {
	if strings.HasPrefix(p, "$[") && strings.HasSuffix(p, "]") {
		return p[2 : len(p)-1], true
	}
	return "", false
}

func splitPath(op, path string) ([]string, error) {
	if path == "" {
		return nil, newErr(CodeEmptyFieldName, "An empty update path is not valid.")
	}
	parts := strings.Split(path, ".")
	for i, p := range parts {
		if p == "" {
			return nil, newErr(CodeEmptyFieldName, "The update path '%s' contains an empty field name, which is not allowed.", path)
		}
		if p == "$" {
			if i == 0 {
				return nil, newErr(CodeBadValue, "Cannot have positional (i.e. '$') element in the first position in path '%s'", path)
			}
			if slices.Contains(parts[i+1:], "$") {
				return nil, newErr(CodeBadValue, "Too many positional (i.e. '$') elements found in path '%s'", path)
			}
			if op == "$rename" {
				return nil, newErr(CodeBadValue, "The source field for $rename may not be dynamic: %s", path)
			}
			continue
		}
		if id, ok := filterIdentifier(p); ok {
			if i == 0 {
				return nil, newErr(CodeBadValue, "Cannot have array filter identifier (i.e. '$[<id>]') element in the first position in path '%s'", path)
			}
			if id != "" && !validIdentifier(id) {
				return nil, newErr(CodeBadValue, "The array filter identifier '%s' in path '%s' must begin with a lowercase letter and contain only alphanumeric characters", id, path)
			}
			continue
		}
		if strings.HasPrefix(p, "$") {
			return nil, newErr(CodeDollarPrefixedFieldName, "The dollar ($) prefixed field '%s' in '%s' is not valid for storage.", p, path)
		}
	}
	return parts, nil
}

func validIdentifier(id string) bool {
	if id == "" || id[0] < 'a' || id[0] > 'z' {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

func parseMod(op string, f bson.E) (*mod, error) {
	parts, err := splitPath(op, f.Key)
	if err != nil {
		return nil, err
	}
	m := &mod{op: op, path: f.Key, parts: parts, arg: f.Value}
	switch op {
	case "$inc", "$mul":
		if !bsonkit.IsNumber(f.Value) {
			verb := "increment"
			if op == "$mul" {
				verb = "multiply"
			}
			return nil, newErr(CodeTypeMismatch, "Cannot %s with non-numeric argument: {%s: %s}", verb, f.Key, fmtValue(f.Value))
		}
	case "$currentDate":
		switch v := f.Value.(type) {
		case bool:
		case bson.D:
			t, _ := bsonkit.Get(v, "$type")
			if len(v) != 1 || v[0].Key != "$type" {
				return nil, newErr(CodeBadValue, "The only valid field of the option is '$type': {$currentDate: {%s: %s}}", f.Key, fmtValue(f.Value))
			}
			switch t {
			case "date":
			case "timestamp":
				m.timestamp = true
			default:
				return nil, newErr(CodeBadValue, "The '$type' string field is required to be 'date' or 'timestamp': {$currentDate: {field : {$type: 'date'}}}")
			}
		default:
			return nil, newErr(CodeBadValue, "%s is not valid type for $currentDate. Please use a boolean ('true') or a $type expression ({$type: 'timestamp/date'}).", mongoerr.TypeName(f.Value))
		}
	case "$rename":
		to, ok := f.Value.(string)
		if !ok {
			return nil, newErr(CodeBadValue, "The 'to' field for $rename must be a string: %s: %s", f.Key, fmtValue(f.Value))
		}
		for _, p := range parts {
			if _, ok := filterIdentifier(p); ok {
				return nil, newErr(CodeBadValue, "The source field for $rename may not be dynamic: %s", f.Key)
			}
		}
		toParts, err := splitPath(op, to)
		if err != nil {
			return nil, err
		}
		for _, p := range toParts {
			if _, ok := filterIdentifier(p); ok {
				return nil, newErr(CodeBadValue, "The destination field for $rename may not be dynamic: %s", to)
			}
		}
		if to == f.Key {
			return nil, newErr(CodeBadValue, "The source and target field for $rename must differ: %s: %s", f.Key, fmtValue(to))
		}
		if isPrefix(parts, toParts) || isPrefix(toParts, parts) {
			return nil, newErr(CodeBadValue, "The source and target field for $rename must not be on the same path: %s: %s", f.Key, fmtValue(to))
		}
		m.to, m.toParts = to, toParts
	case "$pop":
		n, ok := bsonkit.ToFloat64(f.Value)
		if !ok || !bsonkit.IsNumber(f.Value) {
			return nil, newErr(CodeFailedToParse, "Expected a number in: %s: %s", f.Key, fmtValue(f.Value))
		}
		if n != 1 && n != -1 {
			return nil, newErr(CodeFailedToParse, "$pop expects 1 or -1, found: %s", fmtValue(f.Value))
		}
	case "$pullAll":
		if _, ok := f.Value.(bson.A); !ok {
			return nil, newErr(CodeBadValue, "$pullAll requires an array argument but was given a %s", mongoerr.TypeName(f.Value))
		}
	case "$push", "$addToSet":
		if err := parseEach(m); err != nil {
			return nil, err
		}
	case "$pull":
		if err := parsePull(m); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func isPrefix(prefix, path []string) bool {
	if len(prefix) > len(path) {
		return false
	}
	for i := range prefix {
		if prefix[i] != path[i] {
			return false
		}
	}
	return true
}

// parseEach reads the $each form of $push and $addToSet and the $push
// modifiers $slice, $sort and $position.
func parseEach(m *mod) error {
	d, ok := m.arg.(bson.D)
	if !ok {
		m.each = bson.A{m.arg}
		return nil
	}
	eachVal, hasEach := bsonkit.Get(d, "$each")
	if !hasEach {
		m.each = bson.A{m.arg}
		return nil
	}
	arr, ok := eachVal.(bson.A)
	if !ok {
		return newErr(CodeBadValue, "The argument to $each in %s must be an array but it was of type: %s", m.op, mongoerr.TypeName(eachVal))
	}
	m.each = arr
	for _, e := range d {
		if e.Key == "$each" {
			continue
		}
		if m.op == "$addToSet" {
			return newErr(CodeBadValue, "Found unexpected fields after $each in $addToSet: %s", fmtValue(d))
		}
		switch e.Key {
		case "$slice":
			n, err := integral(e.Value)
			if err != nil {
				return newErr(CodeBadValue, "The value for $slice must be an integer value but was given type: %s", mongoerr.TypeName(e.Value))
			}
			m.slice = &n
		case "$position":
			n, err := integral(e.Value)
			if err != nil {
				return newErr(CodeBadValue, "The value for $position must be an integer value, not of type: %s", mongoerr.TypeName(e.Value))
			}
			m.position = &n
		case "$sort":
			s, err := parsePushSort(e.Value)
			if err != nil {
				return err
			}
			m.sortSpec = s
		default:
			return newErr(CodeBadValue, "Unrecognized clause in $push: %s", e.Key)
		}
	}
	return nil
}

func integral(v any) (int64, error) {
	if !bsonkit.IsNumber(v) {
		return 0, newErr(CodeBadValue, "not a number")
	}
	f, _ := bsonkit.ToFloat64(v)
	if f != math.Trunc(f) || math.IsInf(f, 0) || math.IsNaN(f) {
		return 0, newErr(CodeBadValue, "not an integer")
	}
	n, _ := bsonkit.ToInt64(v)
	return n, nil
}

func parsePushSort(v any) (*pushSort, error) {
	if bsonkit.IsNumber(v) {
		f, _ := bsonkit.ToFloat64(v)
		if f != 1 && f != -1 {
			return nil, newErr(CodeBadValue, "The $sort element value must be either 1 or -1")
		}
		return &pushSort{dir: int(f)}, nil
	}
	d, ok := v.(bson.D)
	if !ok {
		return nil, newErr(CodeBadValue, "The $sort is invalid: use 1/-1 to sort the whole element, or {field:1/-1} to sort embedded fields")
	}
	if len(d) == 0 {
		return nil, newErr(CodeBadValue, "The $sort pattern is empty when it should be a set of fields.")
	}
	for _, e := range d {
		f, ok := bsonkit.ToFloat64(e.Value)
		if !ok || !bsonkit.IsNumber(e.Value) || (f != 1 && f != -1) {
			return nil, newErr(CodeBadValue, "The $sort element value must be either 1 or -1")
		}
		if e.Key == "" || strings.HasPrefix(e.Key, "$") || strings.HasPrefix(e.Key, ".") || strings.HasSuffix(e.Key, ".") {
			return nil, newErr(CodeBadValue, "The $sort field is a dotted field but has an empty part: %s", e.Key)
		}
	}
	s, err := query.CompileSort(d)
	if err != nil {
		return nil, newErr(CodeBadValue, "The $sort is invalid: %v", err)
	}
	return &pushSort{byDoc: s}, nil
}

// parsePull compiles a $pull condition. A document whose first key is an
// operator ({$gte: 6}) is matched against each element as {v: element};
// another document is a query matched against document elements; any other
// value removes equal elements.
func parsePull(m *mod) error {
	d, ok := m.arg.(bson.D)
	if !ok {
		return nil
	}
	var filter bson.D
	if len(d) > 0 && strings.HasPrefix(d[0].Key, "$") && d[0].Key != "$and" && d[0].Key != "$or" && d[0].Key != "$nor" && d[0].Key != "$expr" && d[0].Key != "$where" && d[0].Key != "$text" && d[0].Key != "$comment" {
		filter = bson.D{{Key: "v", Value: d}}
		m.pullWrap = true
	} else {
		filter = d
	}
	matcher, err := query.Compile(filter)
	if err != nil {
		if qe, ok := err.(*mongoerr.Error); ok {
			return &mongoerr.Error{Code: qe.Code, CodeName: qe.CodeName, Msg: "$pull: " + qe.Msg}
		}
		return newErr(CodeBadValue, "$pull: %v", err)
	}
	m.pullMatch = matcher
	return nil
}

// checkConflicts rejects two modifications of the same path or of a path
// and one of its prefixes.
func (u *Update) checkConflicts() error {
	type entry struct {
		parts []string
		path  string
		idx   int
	}
	var all []entry
	for i, m := range u.mods {
		all = append(all, entry{m.parts, m.path, i})
		if m.op == "$rename" {
			all = append(all, entry{m.toParts, m.to, i})
		}
	}
	sort.SliceStable(all, func(i, j int) bool { return comparePaths(all[i].parts, all[j].parts) < 0 })
	for i := 1; i < len(all); i++ {
		a, b := all[i-1], all[i]
		if isPrefix(a.parts, b.parts) {
			later := b.path
			if a.idx > b.idx {
				later = a.path
			}
			return newErr(CodeConflictingUpdateOperators, "Updating the path '%s' would create a conflict at '%s'", later, a.path)
		}
	}
	return nil
}
