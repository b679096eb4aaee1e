package bsonkit

import (
	"bytes"
	"encoding/binary"
	"math"
	"strconv"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// Decoder decodes BSON documents into bson.D without reflection: the
// server decodes every command it receives, and the driver's reflective
// decoder was the largest cost of a round trip after the socket itself.
// The result is exactly what bson.Unmarshal produces into a bson.D (nested
// documents as bson.D, arrays as bson.A, empty ones non-nil, every other
// type as its bson type); input with a rarely used type (DBPointer,
// JavaScript with scope, old binary subtype 2) or that is malformed is
// handed to bson.Unmarshal, so those results and every error are the
// driver's own.
//
// A Decoder keeps scratch space and a cache of field names between calls;
// it is not safe for concurrent use. The zero value is ready to use.
type Decoder struct {
	elems []bson.E
	vals  []any
	keys  map[string]string
}

// maxCachedKeys bounds the field-name cache of a Decoder, maxCachedKeyLen
// the length of the names it keeps, and maxKeptScratch the entries of
// scratch space it keeps between calls.
const (
	maxCachedKeys   = 512
	maxCachedKeyLen = 32
	maxKeptScratch  = 1024
)

// Decode decodes one BSON document, which must span all of raw.
func (d *Decoder) Decode(raw []byte) (bson.D, error) {
	return d.DecodeSpare(raw, 0)
}

// DecodeSpare is Decode returning a bson.D with room for spare more
// fields, which the caller appends without another allocation.
func (d *Decoder) DecodeSpare(raw []byte, spare int) (bson.D, error) {
	out, ok := d.doc(raw, spare)
	if cap(d.elems) > maxKeptScratch {
		d.elems = nil // a huge document: do not keep its scratch space
	}
	if cap(d.vals) > maxKeptScratch {
		d.vals = nil
	}
	if ok {
		return out, nil
	}
	d.reset()
	if err := bson.Unmarshal(raw, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// reset drops what an abandoned decode left on the scratch stacks.
func (d *Decoder) reset() {
	clear(d.elems)
	d.elems = d.elems[:0]
	clear(d.vals)
	d.vals = d.vals[:0]
}

// frame returns the body of the document or array at the start of b (its
// bytes between the length prefix and the final NUL) and the rest of b.
func frame(b []byte) (body, rest []byte, ok bool) {
	if len(b) < 5 {
		return nil, nil, false
	}
	n := int64(int32(binary.LittleEndian.Uint32(b)))
	if n < 5 || n > int64(len(b)) || b[n-1] != 0 {
		return nil, nil, false
	}
	return b[4 : n-1], b[n:], true
}

func (d *Decoder) doc(raw []byte, spare int) (bson.D, bool) {
	body, rest, ok := frame(raw)
	if !ok || len(rest) != 0 {
		return nil, false
	}
	return d.docBody(body, spare)
}

func (d *Decoder) docBody(p []byte, spare int) (bson.D, bool) {
	start := len(d.elems)
	for len(p) > 0 {
		t := p[0]
		i := bytes.IndexByte(p[1:], 0)
		if i < 0 {
			return nil, false
		}
		key := d.key(p[1 : 1+i])
		v, rest, ok := d.value(t, p[2+i:])
		if !ok {
			return nil, false
		}
		d.elems = append(d.elems, bson.E{Key: key, Value: v})
		p = rest
	}
	out := make(bson.D, len(d.elems)-start, len(d.elems)-start+spare)
	copy(out, d.elems[start:])
	clear(d.elems[start:])
	d.elems = d.elems[:start]
	return out, true
}

func (d *Decoder) arrBody(p []byte) (bson.A, bool) {
	start := len(d.vals)
	for len(p) > 0 {
		t := p[0]
		i := bytes.IndexByte(p[1:], 0)
		if i < 0 {
			return nil, false
		}
		v, rest, ok := d.value(t, p[2+i:])
		if !ok {
			return nil, false
		}
		d.vals = append(d.vals, v)
		p = rest
	}
	out := make(bson.A, len(d.vals)-start)
	copy(out, d.vals[start:])
	clear(d.vals[start:])
	d.vals = d.vals[:start]
	return out, true
}

// key returns the field name b as a string, shared with earlier documents
// when it is a short name seen before (commands repeat the same few).
func (d *Decoder) key(b []byte) string {
	if len(b) > maxCachedKeyLen {
		return string(b)
	}
	if k, ok := d.keys[string(b)]; ok {
		return k
	}
	k := string(b)
	if d.keys == nil {
		d.keys = make(map[string]string)
	}
	if len(d.keys) < maxCachedKeys {
		d.keys[k] = k
	}
	return k
}

// str reads a BSON string (int32 length including the NUL, bytes, NUL).
func str(p []byte) (string, []byte, bool) {
	if len(p) < 4 {
		return "", nil, false
	}
	n := int64(int32(binary.LittleEndian.Uint32(p)))
	if n <= 0 || n > int64(len(p)-4) || p[4+n-1] != 0 {
		return "", nil, false
	}
	return string(p[4 : 4+n-1]), p[4+n:], true
}

func cstring(p []byte) (string, []byte, bool) {
	i := bytes.IndexByte(p, 0)
	if i < 0 {
		return "", nil, false
	}
	return string(p[:i]), p[i+1:], true
}

// value decodes one element value of BSON type t at the start of p.
func (d *Decoder) value(t byte, p []byte) (any, []byte, bool) {
	switch bson.Type(t) {
	case bson.TypeDouble:
		if len(p) < 8 {
			return nil, nil, false
		}
		return math.Float64frombits(binary.LittleEndian.Uint64(p)), p[8:], true
	case bson.TypeString:
		return str(p)
	case bson.TypeEmbeddedDocument:
		body, rest, ok := frame(p)
		if !ok {
			return nil, nil, false
		}
		doc, ok := d.docBody(body, 0)
		return doc, rest, ok
	case bson.TypeArray:
		body, rest, ok := frame(p)
		if !ok {
			return nil, nil, false
		}
		arr, ok := d.arrBody(body)
		return arr, rest, ok
	case bson.TypeBinary:
		if len(p) < 5 {
			return nil, nil, false
		}
		n := int64(int32(binary.LittleEndian.Uint32(p)))
		sub := p[4]
		if n < 0 || n > int64(len(p)-5) || sub == 0x02 {
			return nil, nil, false // old binary: the driver's own rules
		}
		data := make([]byte, n)
		copy(data, p[5:5+n])
		return bson.Binary{Subtype: sub, Data: data}, p[5+n:], true
	case bson.TypeUndefined:
		return bson.Undefined{}, p, true
	case bson.TypeObjectID:
		if len(p) < 12 {
			return nil, nil, false
		}
		var oid bson.ObjectID
		copy(oid[:], p)
		return oid, p[12:], true
	case bson.TypeBoolean:
		if len(p) < 1 || p[0] > 1 {
			return nil, nil, false
		}
		return p[0] == 1, p[1:], true
	case bson.TypeDateTime:
		if len(p) < 8 {
			return nil, nil, false
		}
		return bson.DateTime(int64(binary.LittleEndian.Uint64(p))), p[8:], true
	case bson.TypeNull:
		return nil, p, true
	case bson.TypeRegex:
		pattern, rest, ok := cstring(p)
		if !ok {
			return nil, nil, false
		}
		opts, rest, ok := cstring(rest)
		if !ok {
			return nil, nil, false
		}
		return bson.Regex{Pattern: pattern, Options: opts}, rest, true
	case bson.TypeJavaScript:
		s, rest, ok := str(p)
		return bson.JavaScript(s), rest, ok
	case bson.TypeSymbol:
		s, rest, ok := str(p)
		return bson.Symbol(s), rest, ok
	case bson.TypeInt32:
		if len(p) < 4 {
			return nil, nil, false
		}
		return int32(binary.LittleEndian.Uint32(p)), p[4:], true
	case bson.TypeTimestamp:
		if len(p) < 8 {
			return nil, nil, false
		}
		return bson.Timestamp{I: binary.LittleEndian.Uint32(p), T: binary.LittleEndian.Uint32(p[4:])}, p[8:], true
	case bson.TypeInt64:
		if len(p) < 8 {
			return nil, nil, false
		}
		return int64(binary.LittleEndian.Uint64(p)), p[8:], true
	case bson.TypeDecimal128:
		if len(p) < 16 {
			return nil, nil, false
		}
		return bson.NewDecimal128(binary.LittleEndian.Uint64(p[8:]), binary.LittleEndian.Uint64(p)), p[16:], true
	case bson.TypeMinKey:
		return bson.MinKey{}, p, true
	case bson.TypeMaxKey:
		return bson.MaxKey{}, p, true
	}
	return nil, nil, false // DBPointer, code with scope, unknown types
}

// AppendDocument appends the BSON encoding of d to dst: the bytes
// bson.Marshal(d) produces. The types a server's replies and stored
// documents hold are encoded without reflection; any other value is
// encoded by bson.MarshalValue. It returns false (and dst unchanged in
// length) when bson.Marshal would fail or when it cannot be sure to match
// it; the caller then uses bson.Marshal.
func AppendDocument(dst []byte, d bson.D) ([]byte, bool) {
	start := len(dst)
	out, ok := appendDoc(dst, d)
	if !ok {
		return dst[:start], false
	}
	return out, true
}

func appendDoc(dst []byte, d bson.D) ([]byte, bool) {
	idx, dst := bsoncore.ReserveLength(dst)
	for _, e := range d {
		if strings.IndexByte(e.Key, 0) >= 0 {
			return dst, false
		}
		var ok bool
		if dst, ok = appendElem(dst, e.Key, -1, e.Value); !ok {
			return dst, false
		}
	}
	dst = append(dst, 0)
	return bsoncore.UpdateLength(dst, idx, int32(len(dst)-int(idx))), len(dst)-int(idx) <= math.MaxInt32
}

func appendArr(dst []byte, a bson.A) ([]byte, bool) {
	idx, dst := bsoncore.ReserveLength(dst)
	for i, v := range a {
		var ok bool
		if dst, ok = appendElem(dst, "", i, v); !ok {
			return dst, false
		}
	}
	dst = append(dst, 0)
	return bsoncore.UpdateLength(dst, idx, int32(len(dst)-int(idx))), len(dst)-int(idx) <= math.MaxInt32
}

// header appends an element's type and name: key, or the array index i
// when i >= 0.
func header(dst []byte, t bson.Type, key string, i int) []byte {
	dst = append(dst, byte(t))
	if i >= 0 {
		dst = strconv.AppendInt(dst, int64(i), 10)
	} else {
		dst = append(dst, key...)
	}
	return append(dst, 0)
}

func appendElem(dst []byte, key string, i int, v any) ([]byte, bool) {
	switch x := v.(type) {
	case nil:
		return header(dst, bson.TypeNull, key, i), true
	case bson.D:
		if x == nil {
			break
		}
		return appendDoc(header(dst, bson.TypeEmbeddedDocument, key, i), x)
	case bson.A:
		if x == nil {
			break
		}
		return appendArr(header(dst, bson.TypeArray, key, i), x)
	case string:
		return bsoncore.AppendString(header(dst, bson.TypeString, key, i), x), true
	case bool:
		return bsoncore.AppendBoolean(header(dst, bson.TypeBoolean, key, i), x), true
	case int32:
		return bsoncore.AppendInt32(header(dst, bson.TypeInt32, key, i), x), true
	case int64:
		return bsoncore.AppendInt64(header(dst, bson.TypeInt64, key, i), x), true
	case int:
		if int64(x) >= math.MinInt32 && int64(x) <= math.MaxInt32 {
			return bsoncore.AppendInt32(header(dst, bson.TypeInt32, key, i), int32(x)), true
		}
		return bsoncore.AppendInt64(header(dst, bson.TypeInt64, key, i), int64(x)), true
	case float64:
		return bsoncore.AppendDouble(header(dst, bson.TypeDouble, key, i), x), true
	case bson.ObjectID:
		return append(header(dst, bson.TypeObjectID, key, i), x[:]...), true
	case bson.DateTime:
		return bsoncore.AppendDateTime(header(dst, bson.TypeDateTime, key, i), int64(x)), true
	case time.Time:
		return bsoncore.AppendDateTime(header(dst, bson.TypeDateTime, key, i), int64(bson.NewDateTimeFromTime(x))), true
	case bson.Timestamp:
		return bsoncore.AppendTimestamp(header(dst, bson.TypeTimestamp, key, i), x.T, x.I), true
	case bson.Binary:
		return bsoncore.AppendBinary(header(dst, bson.TypeBinary, key, i), x.Subtype, x.Data), true
	case bson.Decimal128:
		h, l := x.GetBytes()
		return bsoncore.AppendDecimal128(header(dst, bson.TypeDecimal128, key, i), h, l), true
	case bson.Undefined:
		return header(dst, bson.TypeUndefined, key, i), true
	case bson.MinKey:
		return header(dst, bson.TypeMinKey, key, i), true
	case bson.MaxKey:
		return header(dst, bson.TypeMaxKey, key, i), true
	case bson.JavaScript:
		return bsoncore.AppendString(header(dst, bson.TypeJavaScript, key, i), string(x)), true
	case bson.Symbol:
		return bsoncore.AppendString(header(dst, bson.TypeSymbol, key, i), string(x)), true
	}
	t, b, err := bson.MarshalValue(v)
	if err != nil {
		return dst, false
	}
	return append(header(dst, t, key, i), b...), true
}
