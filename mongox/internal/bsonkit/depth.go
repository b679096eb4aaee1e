package bsonkit

import (
	"bytes"
	"encoding/binary"
	"fmt"
)

// MaxWireDepth is the deepest document the server accepts off the wire:
// 200 levels of embedded documents and arrays below the top-level document,
// mongod's default maxBSONDepth. mongod validates every incoming message
// (net.wireObjectCheck, on by default) and refuses a deeper one with code
// 15, Overflow, "BSONObj exceeds maximum nested object depth". Documents a
// user stores are held to less (maxBSONDepth - 20 = 180 levels in mongod,
// "no more than 100 levels" in the manual's Limits page), checked where
// they are written.
const MaxWireDepth = 200

// DepthError reports a document nested deeper than a limit.
type DepthError struct {
	// Limit is the number of levels below the top-level document allowed.
	Limit int
}

// Error implements error, with mongod's wording.
func (e *DepthError) Error() string {
	return fmt.Sprintf("BSONObj exceeds maximum nested object depth (more than %d levels of embedded documents and arrays)", e.Limit)
}

// CheckDepth walks the BSON document b, which must span all of b, and
// reports a *DepthError when documents or arrays nest more than limit
// levels below it (a document with no embedded document has no level; the
// scope of a JavaScript-with-scope value counts two, as mongod counts it).
// It reads only length prefixes, types and names, with an explicit stack
// and no recursion, and stops at the first level too many: whatever the
// depth of b, it uses memory in proportion to limit. Every other error
// describes bytes that are not framed as BSON; a document CheckDepth accepts
// may still hold invalid values (bson.Raw.Validate says which), but it can
// be validated and decoded by recursive code without exhausting the stack.
func CheckDepth(b []byte, limit int) error {
	n, err := docLen(b, 0, len(b))
	if err != nil {
		return err
	}
	if n != len(b) {
		return fmt.Errorf("document length %d does not span the %d bytes given", n, len(b))
	}
	// open holds, for each document open around pos, the offset of its
	// terminating NUL and the levels it adds (2 for a code-with-scope
	// scope, else 1; 0 for the top level).
	type level struct{ end, weight int }
	open := make([]level, 1, 16)
	open[0] = level{end: n - 1}
	depth, pos := 0, 4
	for len(open) > 0 {
		top := open[len(open)-1]
		if pos == top.end {
			if b[pos] != 0 {
				return fmt.Errorf("document at byte %d does not end with NUL", pos)
			}
			pos++
			open = open[:len(open)-1]
			depth -= top.weight
			continue
		}
		t := b[pos]
		i := bytes.IndexByte(b[pos+1:top.end], 0)
		if i < 0 {
			return fmt.Errorf("field name at byte %d is not NUL-terminated within its document", pos+1)
		}
		pos += 2 + i // type, name, NUL
		var size int
		switch t {
		case 0x03, 0x04: // document, array
			if size, err = docLen(b, pos, top.end); err != nil {
				return err
			}
			if depth+1 > limit {
				return &DepthError{Limit: limit}
			}
			open = append(open, level{end: pos + size - 1, weight: 1})
			depth++
			pos += 4
			continue
		case 0x0F: // JavaScript code with scope: int32 size, string, document
			if _, err = fixedLen(pos, top.end, 4); err != nil {
				return err
			}
			total := int(int32(binary.LittleEndian.Uint32(b[pos:])))
			if total < 14 || pos+total > top.end {
				return fmt.Errorf("code with scope at byte %d: size %d out of range", pos, total)
			}
			strLen, err := stringLen(b, pos+4, pos+total)
			if err != nil {
				return err
			}
			scope := pos + 4 + strLen
			ssize, err := docLen(b, scope, pos+total)
			if err != nil {
				return err
			}
			if scope+ssize != pos+total {
				return fmt.Errorf("code with scope at byte %d: scope does not end with the value", pos)
			}
			if depth+2 > limit {
				return &DepthError{Limit: limit}
			}
			open = append(open, level{end: pos + total - 1, weight: 2})
			depth += 2
			pos = scope + 4
			continue
		case 0x01, 0x09, 0x11, 0x12: // double, datetime, timestamp, int64
			size, err = fixedLen(pos, top.end, 8)
		case 0x10: // int32
			size, err = fixedLen(pos, top.end, 4)
		case 0x08: // bool
			size, err = fixedLen(pos, top.end, 1)
		case 0x07: // ObjectId
			size, err = fixedLen(pos, top.end, 12)
		case 0x13: // decimal128
			size, err = fixedLen(pos, top.end, 16)
		case 0x06, 0x0A, 0x7F, 0xFF: // undefined, null, maxKey, minKey
		case 0x02, 0x0D, 0x0E: // string, JavaScript code, symbol
			size, err = stringLen(b, pos, top.end)
		case 0x0C: // DBPointer: string, ObjectId
			if size, err = stringLen(b, pos, top.end); err == nil {
				var oid int
				oid, err = fixedLen(pos+size, top.end, 12)
				size += oid
			}
		case 0x05: // binary: int32 size, subtype, bytes
			if size, err = fixedLen(pos, top.end, 5); err == nil {
				n := int64(int32(binary.LittleEndian.Uint32(b[pos:])))
				if n < 0 || int64(pos)+5+n > int64(top.end) {
					return fmt.Errorf("binary at byte %d: size %d out of range", pos, n)
				}
				size += int(n)
			}
		case 0x0B: // regular expression: two C strings
			for range 2 {
				j := bytes.IndexByte(b[pos+size:top.end], 0)
				if j < 0 {
					return fmt.Errorf("regular expression at byte %d is not NUL-terminated", pos)
				}
				size += j + 1
			}
		default:
			return fmt.Errorf("unknown BSON type %#02x at byte %d", t, pos)
		}
		if err != nil {
			return err
		}
		pos += size
	}
	return nil
}

// docLen reads the length of the document starting at pos, which must end
// at or before end (exclusive).
func docLen(b []byte, pos, end int) (int, error) {
	if pos+4 > end {
		return 0, fmt.Errorf("document at byte %d: too short for its length", pos)
	}
	n := int64(int32(binary.LittleEndian.Uint32(b[pos:])))
	if n < 5 || int64(pos)+n > int64(end) {
		return 0, fmt.Errorf("document at byte %d: length %d out of range", pos, n)
	}
	return int(n), nil
}

// fixedLen checks that n bytes starting at pos end before end.
func fixedLen(pos, end, n int) (int, error) {
	if pos+n > end {
		return 0, fmt.Errorf("value at byte %d: %d bytes do not fit in its document", pos, n)
	}
	return n, nil
}

// stringLen returns the size of the BSON string at pos: its int32 length
// (which counts the final NUL) and its bytes.
func stringLen(b []byte, pos, end int) (int, error) {
	if pos+4 > end {
		return 0, fmt.Errorf("string at byte %d: too short for its length", pos)
	}
	n := int64(int32(binary.LittleEndian.Uint32(b[pos:])))
	if n < 1 || int64(pos)+4+n > int64(end) {
		return 0, fmt.Errorf("string at byte %d: length %d out of range", pos, n)
	}
	return 4 + int(n), nil
}

// NestedDocument returns {"": {"": ... {}}} with levels embedded documents
// below the top level, built without recursion (bson.Marshal recurses): 7
// bytes a level, so 2,000,000 levels fit in 14 MB, under MongoDB's 48 MB
// message size. Tests and fuzz seeds of the depth limit use it.
func NestedDocument(levels int) []byte {
	size := 5 + 7*levels
	b := make([]byte, 0, size)
	for i := range levels {
		b = binary.LittleEndian.AppendUint32(b, uint32(size-7*i))
		b = append(b, 0x03, 0) // an embedded document named ""
	}
	b = binary.LittleEndian.AppendUint32(b, 5)
	for range levels + 1 {
		b = append(b, 0)
	}
	return b
}
