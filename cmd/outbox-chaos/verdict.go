package main

import "fmt"

// verdict gathers the FAIL lines of a check, at most maxFailLines of each
// kind; lines then adds one line per kind that had more.
type verdict struct {
	failures []string
	lines    map[string]int
	kinds    []string
}

// fail records a violation of the given kind.
func (v *verdict) fail(kind, format string, args ...any) {
	if v.lines == nil {
		v.lines = map[string]int{}
	}
	if v.lines[kind] == 0 {
		v.kinds = append(v.kinds, kind)
	}
	v.lines[kind]++
	if v.lines[kind] <= maxFailLines {
		v.failures = append(v.failures, fmt.Sprintf(format, args...))
	}
}

// count is how many violations of a kind were recorded.
func (v *verdict) count(kind string) int { return v.lines[kind] }

// all returns the FAIL lines, with a line per kind whose lines were cut.
func (v *verdict) all() []string {
	out := append([]string(nil), v.failures...)
	for _, k := range v.kinds {
		if n := v.lines[k]; n > maxFailLines {
			out = append(out, fmt.Sprintf("... %d more %s lines not shown (%d in all)", n-maxFailLines, k, n))
		}
	}
	return out
}
