package inboxhost

import (
	"fmt"
	"net/url"
	"strings"
	"unicode/utf8"
)

// String returns "topic/schema/key", the form ParseID reads, with each part
// escaped: '%', '/', control characters and bytes that are not UTF-8 are
// written %XX (a key "order/42" as "order%2F42"). Any id, whatever its
// parts hold, reads back the same, and two ids never share a string (a
// content schema "OrderPlaced.v1/order" with key "42" is
// "t/OrderPlaced.v1%2Forder/42", not the "t/OrderPlaced.v1/order/42" of
// key "order/42"). The string is safe to print on a terminal and in JSON.
func (id ID) String() string {
	return escapeIDPart(id.Topic) + "/" + escapeIDPart(id.ContentSchema) + "/" + escapeIDPart(id.IdempotencyKey)
}

// ParseID reads "topic/schema/key" as ID.String writes it: three parts
// separated by the only two slashes, each part unescaped (%XX is the byte
// XX; write a slash inside a part as %2F and a percent sign as %25).
func ParseID(s string) (ID, error) {
	parts := strings.Split(s, "/")
	if len(parts) != 3 {
		return ID{}, fmt.Errorf("outbox: inbox id %q: want topic/schema/key, three parts separated by two slashes "+
			"(a slash inside a part is written %%2F, as \"parked list\" and the console print ids)", s)
	}
	var out [3]string
	for i, p := range parts {
		v, err := url.PathUnescape(p)
		if err != nil {
			return ID{}, fmt.Errorf("outbox: inbox id %q: %s: %w (a percent sign inside a part is written %%25)",
				s, [3]string{"topic", "schema", "key"}[i], err)
		}
		out[i] = v
	}
	return ID{Topic: out[0], ContentSchema: out[1], IdempotencyKey: out[2]}, nil
}

// escapeIDPart escapes one part of an ID string: '%', '/', control
// characters (C0 and DEL) and invalid UTF-8 bytes become %XX.
func escapeIDPart(s string) string {
	clean := true
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if needsEscape(r, n) {
			clean = false
			break
		}
		i += n
	}
	if clean {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 8)
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if needsEscape(r, n) {
			for _, c := range []byte(s[i : i+n]) {
				fmt.Fprintf(&b, "%%%02X", c)
			}
		} else {
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

func needsEscape(r rune, n int) bool {
	return r == '%' || r == '/' || r < 0x20 || r == 0x7f || (r == utf8.RuneError && n == 1)
}
