package query

import (
	"fmt"
	"math"

	"github.com/event-outbox/outbox/mongox/internal/bsonkit"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// pred tests one value; v is the sentinel missing when the path resolved to
// nothing.
type pred interface {
	test(v any) bool
}

func isMissing(v any) bool {
	_, ok := v.(missingT)
	return ok
}

func isNullValue(v any) bool {
	switch v.(type) {
	case nil, bson.Null:
		return true
	}
	return false
}

func isNaN(v any) bool {
	switch x := v.(type) {
	case float64:
		return math.IsNaN(x)
	case float32:
		return math.IsNaN(float64(x))
	case bson.Decimal128:
		return x.IsNaN()
	}
	return false
}

func numberValue(v any) (float64, bool) { return bsonkit.ToFloat64(v) }

// eqPred is equality under bsonkit.Compare; equality to null also matches a
// missing path.
type eqPred struct {
	v    any
	rank int
	null bool
	nan  bool
}

func newEqPred(v any) *eqPred {
	v = normValue(v)
	return &eqPred{v: v, rank: bsonkit.Rank(v), null: isNullValue(v), nan: isNaN(v)}
}

func (p *eqPred) test(x any) bool {
	if p.null {
		return isMissing(x) || isNullValue(x)
	}
	switch q := p.v.(type) {
	case string:
		s, ok := x.(string)
		if ok {
			return s == q
		}
	case bson.ObjectID:
		o, ok := x.(bson.ObjectID)
		if ok {
			return o == q
		}
	case bool:
		b, ok := x.(bool)
		if ok {
			return b == q
		}
	}
	if isMissing(x) || bsonkit.Rank(x) != p.rank {
		return false
	}
	if p.rank == bsonkit.RankNumber {
		return compareNumbers(x, p.v) == 0
	}
	return bsonkit.Compare(x, p.v) == 0
}

const (
	cmpLT = iota
	cmpLTE
	cmpGT
	cmpGTE
)

// cmpPred implements $lt/$lte/$gt/$gte with type bracketing: only values of
// the query value's canonical type compare, except against MinKey/MaxKey.
type cmpPred struct {
	op      int
	v       any
	rank    int
	anyType bool
	nan     bool
}

func newCmpPred(name string, v any) *cmpPred {
	v = normValue(v)
	p := &cmpPred{v: v, rank: bsonkit.Rank(v), nan: isNaN(v)}
	switch name {
	case "$lt":
		p.op = cmpLT
	case "$lte":
		p.op = cmpLTE
	case "$gt":
		p.op = cmpGT
	default:
		p.op = cmpGTE
	}
	p.anyType = p.rank == bsonkit.RankMinKey || p.rank == bsonkit.RankMaxKey
	return p
}

func (p *cmpPred) test(x any) bool {
	if isMissing(x) {
		x = nil
	}
	if !p.anyType {
		if bsonkit.Rank(x) != p.rank {
			return false
		}
		if p.rank == bsonkit.RankNumber {
			xn := isNaN(x)
			if p.nan || xn {
				return p.nan && xn && (p.op == cmpLTE || p.op == cmpGTE)
			}
		}
	}
	var c int
	if !p.anyType && p.rank == bsonkit.RankNumber {
		c = compareNumbers(x, p.v)
	} else {
		c = bsonkit.Compare(x, p.v)
	}
	switch p.op {
	case cmpLT:
		return c < 0
	case cmpLTE:
		return c <= 0
	case cmpGT:
		return c > 0
	}
	return c >= 0
}

// inPred implements $in: equality to any listed value, or a regex match.
type inPred struct {
	eqs  []*eqPred
	regs []*regexPred
	keys map[string]struct{} // set of eq keys when the list is long
	null bool
}

const inMapThreshold = 16

func newInPred(name string, v any) (*inPred, error) {
	arr, ok := asArr(v)
	if !ok {
		return nil, badValue("%s needs an array", name)
	}
	p := &inPred{}
	for _, el := range arr {
		if re, ok := el.(bson.Regex); ok {
			rp, err := newRegexPred(re.Pattern, re.Options)
			if err != nil {
				return nil, err
			}
			p.regs = append(p.regs, rp)
			continue
		}
		if _, ok := isOperatorDoc(el); ok {
			return nil, badValue("cannot nest $ under %s", name)
		}
		e := newEqPred(el)
		if e.null {
			p.null = true
		}
		p.eqs = append(p.eqs, e)
	}
	if len(p.eqs) > inMapThreshold {
		p.keys = make(map[string]struct{}, len(p.eqs))
		for _, e := range p.eqs {
			p.keys[bsonkit.Key(e.v)] = struct{}{}
		}
	}
	return p, nil
}

func (p *inPred) test(x any) bool {
	if p.keys != nil {
		if isMissing(x) || isNullValue(x) {
			if p.null {
				return true
			}
		} else if _, undef := x.(bson.Undefined); !undef {
			if _, ok := p.keys[bsonkit.Key(x)]; ok {
				return true
			}
		}
	} else {
		for _, e := range p.eqs {
			if e.test(x) {
				return true
			}
		}
	}
	for _, r := range p.regs {
		if r.test(x) {
			return true
		}
	}
	return false
}

type existsPred struct{}

func (existsPred) test(x any) bool { return !isMissing(x) }

// BSON type codes, as $type numbers them.
var typeAliases = map[string]int32{
	"double": 1, "string": 2, "object": 3, "array": 4, "binData": 5, "undefined": 6,
	"objectId": 7, "bool": 8, "date": 9, "null": 10, "regex": 11, "dbPointer": 12,
	"javascript": 13, "symbol": 14, "javascriptWithScope": 15, "int": 16,
	"timestamp": 17, "long": 18, "decimal": 19, "minKey": -1, "maxKey": 127,
}

const typeNumber = 1000 // pseudo code for the "number" alias

func typeCode(v any) int32 {
	switch v.(type) {
	case float64, float32:
		return 1
	case string:
		return 2
	case bson.D, bson.M, bson.Raw:
		return 3
	case bson.A, []any:
		return 4
	case bson.Binary, []byte:
		return 5
	case bson.Undefined:
		return 6
	case bson.ObjectID:
		return 7
	case bool:
		return 8
	case bson.DateTime:
		return 9
	case nil, bson.Null:
		return 10
	case bson.Regex:
		return 11
	case bson.DBPointer:
		return 12
	case bson.JavaScript:
		return 13
	case bson.Symbol:
		return 14
	case bson.CodeWithScope:
		return 15
	case int32:
		return 16
	case bson.Timestamp:
		return 17
	case int64, int:
		return 18
	case bson.Decimal128:
		return 19
	case bson.MinKey:
		return -1
	case bson.MaxKey:
		return 127
	}
	return 3
}

// typePred implements $type with one or several type codes or aliases.
type typePred struct {
	codes []int32
}

func parseTypeCode(v any) (int32, error) {
	if s, ok := v.(string); ok {
		if s == "number" {
			return typeNumber, nil
		}
		c, ok := typeAliases[s]
		if !ok {
			return 0, badValue("Unknown type name alias: %s", s)
		}
		return c, nil
	}
	f, ok := numberValue(v)
	if !ok {
		return 0, newErr(CodeTypeMismatch, "type must be represented as a number or a string")
	}
	if f != math.Trunc(f) {
		return 0, badValue("Invalid numerical type code: %v", f)
	}
	c := int32(f)
	if float64(c) != f || !((c >= 1 && c <= 19) || c == -1 || c == 127) {
		return 0, badValue("Invalid numerical type code: %v", f)
	}
	return c, nil
}

func newTypePred(v any) (*typePred, error) {
	p := &typePred{}
	if arr, ok := asArr(v); ok {
		for _, el := range arr {
			c, err := parseTypeCode(el)
			if err != nil {
				return nil, err
			}
			p.codes = append(p.codes, c)
		}
		return p, nil
	}
	c, err := parseTypeCode(v)
	if err != nil {
		return nil, err
	}
	p.codes = []int32{c}
	return p, nil
}

func (p *typePred) test(x any) bool {
	if isMissing(x) {
		return false
	}
	code := typeCode(x)
	for _, c := range p.codes {
		if c == code || (c == typeNumber && (code == 1 || code == 16 || code == 18 || code == 19)) {
			return true
		}
	}
	return false
}

// sizePred implements $size (on the array at the path, not its elements).
type sizePred struct{ n int }

func newSizePred(v any) (*sizePred, error) {
	f, ok := numberValue(v)
	if !ok {
		return nil, badValue("$size needs a number")
	}
	if f != math.Trunc(f) || math.IsNaN(f) {
		return nil, badValue("$size must be a whole number")
	}
	if f < 0 {
		return nil, badValue("$size may not be negative")
	}
	if f > math.MaxInt32 {
		return &sizePred{n: -1}, nil
	}
	return &sizePred{n: int(f)}, nil
}

func (p *sizePred) test(x any) bool {
	arr, ok := asArr(x)
	return ok && len(arr) == p.n
}

// modPred implements $mod: [divisor, remainder] over truncated numbers.
type modPred struct{ d, r int64 }

func truncInt(v any) (int64, bool) {
	switch x := v.(type) {
	case int32:
		return int64(x), true
	case int64:
		return x, true
	case int:
		return int64(x), true
	}
	f, ok := numberValue(v)
	if !ok || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, false
	}
	f = math.Trunc(f)
	if f < math.MinInt64 || f >= math.MaxInt64 {
		return 0, false
	}
	return int64(f), true
}

func newModPred(v any) (*modPred, error) {
	arr, ok := asArr(v)
	if !ok {
		return nil, badValue("malformed mod, needs to be an array")
	}
	if len(arr) < 2 {
		return nil, badValue("malformed mod, not enough elements")
	}
	if len(arr) > 2 {
		return nil, badValue("malformed mod, too many elements")
	}
	if !bsonkit.IsNumber(arr[0]) {
		return nil, badValue("malformed mod, divisor not a number")
	}
	if !bsonkit.IsNumber(arr[1]) {
		return nil, badValue("malformed mod, remainder not a number")
	}
	d, ok := truncInt(arr[0])
	if !ok {
		return nil, badValue("malformed mod, divisor value is invalid")
	}
	r, ok := truncInt(arr[1])
	if !ok {
		return nil, badValue("malformed mod, remainder value is invalid")
	}
	if d == 0 {
		return nil, badValue("divisor cannot be 0")
	}
	return &modPred{d: d, r: r}, nil
}

func (p *modPred) test(x any) bool {
	if isMissing(x) || !bsonkit.IsNumber(x) {
		return false
	}
	n, ok := truncInt(x)
	if !ok {
		return false
	}
	if p.d == -1 {
		return p.r == 0
	}
	return n%p.d == p.r
}

// elemMatchObjPred implements $elemMatch with a filter over subdocuments.
type elemMatchObjPred struct{ n node }

// elemMatchValPred implements $elemMatch with operators over element values.
type elemMatchValPred struct{ ops []op }

// logicalInElemMatch are the top-level keys that make an $elemMatch argument
// a document filter even though they start with '$'.
var logicalInElemMatch = map[string]bool{
	"$and": true, "$or": true, "$nor": true, "$where": true, "$expr": true,
	"$text": true, "$comment": true, "$alwaysTrue": true, "$alwaysFalse": true, "$jsonSchema": true,
}

func newElemMatchPred(v any, depth level) (pred, error) {
	d, ok := asDoc(v)
	if !ok {
		return nil, badValue("$elemMatch needs an Object")
	}
	if len(d) > 0 && len(d[0].Key) > 0 && d[0].Key[0] == '$' && !logicalInElemMatch[d[0].Key] {
		ops, err := compileOps(d, depth.next())
		if err != nil {
			return nil, err
		}
		return &elemMatchValPred{ops: ops}, nil
	}
	n, err := compileDoc(d, depth.next())
	if err != nil {
		return nil, err
	}
	return &elemMatchObjPred{n: n}, nil
}

func (p *elemMatchObjPred) test(x any) bool {
	arr, ok := asArr(x)
	if !ok {
		return false
	}
	for _, e := range arr {
		switch d := e.(type) {
		case bson.D:
			if p.n.match(d) {
				return true
			}
		case bson.M:
			if p.n.match(docFromM(d)) {
				return true
			}
		case bson.A:
			if p.n.match(arrayAsDoc(d)) {
				return true
			}
		}
	}
	return false
}

func arrayAsDoc(a bson.A) bson.D {
	d := make(bson.D, len(a))
	for i, v := range a {
		d[i] = bson.E{Key: fmt.Sprint(i), Value: v}
	}
	return d
}

func (p *elemMatchValPred) test(x any) bool {
	arr, ok := asArr(x)
	if !ok {
		return false
	}
next:
	for _, e := range arr {
		for _, o := range p.ops {
			if !o.single(e) {
				continue next
			}
		}
		return true
	}
	return false
}

// bitsPred implements $bitsAllSet, $bitsAnySet, $bitsAllClear and
// $bitsAnyClear.
type bitsPred struct {
	positions []int
	set       bool // testing for set bits (else clear)
	all       bool // all positions (else any)
}

func newBitsPred(name string, v any) (*bitsPred, error) {
	p := &bitsPred{
		set: name == "$bitsAllSet" || name == "$bitsAnySet",
		all: name == "$bitsAllSet" || name == "$bitsAllClear",
	}
	switch x := v.(type) {
	case bson.Binary:
		for i, b := range x.Data {
			for j := 0; j < 8; j++ {
				if b&(1<<j) != 0 {
					p.positions = append(p.positions, i*8+j)
				}
			}
		}
		return p, nil
	case bson.A, []any:
		arr, _ := asArr(x)
		for _, el := range arr {
			n, ok := bsonkit.ToInt64(el)
			if !ok {
				return nil, badValue("bit positions must be an integer but got: %v", el)
			}
			if n < 0 {
				return nil, badValue("bit positions must be >= 0 but got: %d", n)
			}
			p.positions = append(p.positions, int(min(n, 1<<20)))
		}
		return p, nil
	}
	if !bsonkit.IsNumber(v) {
		return nil, badValue("%s takes an Array, a number, or a BinData but received: %v", name, v)
	}
	n, ok := bsonkit.ToInt64(v)
	if !ok {
		return nil, badValue("%s cannot represent value as a 64-bit integer: %v", name, v)
	}
	if n < 0 {
		return nil, badValue("%s bitmask must be non-negative", name)
	}
	for j := 0; j < 63; j++ {
		if n&(1<<j) != 0 {
			p.positions = append(p.positions, j)
		}
	}
	return p, nil
}

func (p *bitsPred) test(x any) bool {
	var bit func(pos int) bool
	switch v := x.(type) {
	case bson.Binary:
		bit = func(pos int) bool { return pos/8 < len(v.Data) && v.Data[pos/8]&(1<<(pos%8)) != 0 }
	default:
		if !bsonkit.IsNumber(x) {
			return false
		}
		n, ok := bsonkit.ToInt64(x)
		if !ok {
			return false
		}
		bit = func(pos int) bool {
			if pos >= 63 {
				return n < 0
			}
			return n&(1<<pos) != 0
		}
	}
	for _, pos := range p.positions {
		if bit(pos) == p.set {
			if !p.all {
				return true
			}
		} else if p.all {
			return false
		}
	}
	return p.all
}
