// Package kwire follows the frames of a Kafka connection as they are
// written and read, so that a connection wrapper can decode the requests
// and responses it cares about (kafkax.HeartbeatTap, the chaos harness's
// produce refusals) without buffering the others.
package kwire

import "encoding/binary"

// Limits of a followed stream: a frame larger than MaxFrame is not Kafka's,
// and a kept frame larger than MaxKeptFrame stops the following.
const (
	MaxKeptFrame = 4 << 20
	MaxFrame     = 1 << 30
)

// SkipTags skips a tagged-field section: a count, then per field a tag, a
// size and that many bytes, all sizes unsigned varints.
func SkipTags(b []byte) ([]byte, bool) {
	count, n := binary.Uvarint(b)
	if n <= 0 {
		return nil, false
	}
	b = b[n:]
	for range count {
		if _, n = binary.Uvarint(b); n <= 0 {
			return nil, false
		}
		b = b[n:]
		size, n := binary.Uvarint(b)
		if n <= 0 || uint64(len(b)-n) < size {
			return nil, false
		}
		b = b[n+int(size):]
	}
	return b, true
}

// Splitter follows one direction of a Kafka connection: frames of a
// four-byte big-endian size and a body. It hands the whole body of the
// frames its head function selects to done, and skips the others without
// keeping them.
type Splitter struct {
	size    [4]byte
	sizeN   int    // bytes of size read
	left    int    // body bytes of the current frame not read yet
	head    []byte // the first HeadLen bytes of the body
	keep    bool   // the current frame is kept whole
	decided bool   // head was judged
	body    []byte
}

// HeadLen is how many bytes of a frame's body a Splitter gathers before
// asking whether to keep the frame: a request's api key, version and
// correlation id, or a response's correlation id and what follows it.
const HeadLen = 8

// Feed consumes p. It returns false when the stream cannot be a Kafka
// stream (a size out of bounds, a kept frame too large).
func (s *Splitter) Feed(p []byte, head func([]byte) bool, done func([]byte)) bool {
	for len(p) > 0 {
		if s.sizeN < 4 {
			k := copy(s.size[s.sizeN:], p)
			s.sizeN += k
			p = p[k:]
			if s.sizeN < 4 {
				return true
			}
			n := int32(binary.BigEndian.Uint32(s.size[:]))
			if n < 0 || n > MaxFrame {
				return false
			}
			s.left, s.head, s.keep, s.decided, s.body = int(n), s.head[:0], false, false, nil
			if s.left == 0 {
				s.sizeN = 0
				continue
			}
		}
		if !s.decided {
			k := min(HeadLen-len(s.head), s.left, len(p))
			s.head = append(s.head, p[:k]...)
			p, s.left = p[k:], s.left-k
			if len(s.head) < HeadLen && s.left > 0 {
				continue
			}
			s.decided = true
			if s.keep = head(s.head); s.keep {
				if len(s.head)+s.left > MaxKeptFrame {
					return false
				}
				s.body = append(make([]byte, 0, len(s.head)+s.left), s.head...)
			}
		}
		k := min(s.left, len(p))
		if s.keep {
			s.body = append(s.body, p[:k]...)
		}
		p, s.left = p[k:], s.left-k
		if s.left == 0 {
			if s.keep {
				done(s.body)
			}
			s.sizeN, s.body = 0, nil
		}
	}
	return true
}
