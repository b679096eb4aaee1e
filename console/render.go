package console

import (
	"fmt"
	"html/template"
	"strings"
	"time"

	"github.com/event-outbox/outbox"
)

// pageNames are the templates of templates/<name>.html, each rendered
// inside templates/layout.html.
var pageNames = []string{"overview", "parked", "event", "failed", "outbox-event", "partitions", "find", "action", "login", "error", "health", "scheduled"}

func parseTemplates() (map[string]*template.Template, error) {
	funcs := template.FuncMap{
		"age":   fmtAge,
		"ago":   fmtAgo,
		"tm":    fmtTime,
		"short": shorten,
		"chart": barChart,
		"add":   func(a, b int) int { return a + b },
		"idstr": func(id outbox.InboxID) string { return id.String() },
	}
	out := map[string]*template.Template{}
	for _, n := range pageNames {
		t, err := template.New(n).Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/"+n+".html")
		if err != nil {
			return nil, fmt.Errorf("console: parse template %s: %w", n, err)
		}
		out[n] = t
	}
	return out, nil
}

// fmtAge writes a duration the way operators read it: 3s, 4m10s, 2h5m, 3d4h.
func fmtAge(d time.Duration) string {
	switch {
	case d <= 0:
		return "–"
	case d < time.Minute:
		return d.Truncate(time.Second).String()
	case d < time.Hour:
		return d.Truncate(time.Second).String()
	case d < 48*time.Hour:
		return strings.TrimSuffix(d.Truncate(time.Minute).String(), "0s")
	}
	return fmt.Sprintf("%dd%dh", d/(24*time.Hour), (d%(24*time.Hour))/time.Hour)
}

// fmtAgo writes how long ago something happened: "just now" under a
// second, else "4m10s ago".
func fmtAgo(d time.Duration) string {
	if d < time.Second {
		return "just now"
	}
	return fmtAge(d) + " ago"
}

// fmtTime writes a time in UTC to the second; nil and zero times as "–".
func fmtTime(v any) string {
	var t time.Time
	switch x := v.(type) {
	case time.Time:
		t = x
	case *time.Time:
		if x != nil {
			t = *x
		}
	}
	if t.IsZero() {
		return "–"
	}
	return t.UTC().Format("2006-01-02 15:04:05Z")
}

func shorten(n int, s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len([]rune(s)) <= n {
		return s
	}
	return string([]rune(s)[:n]) + "…"
}

// barChart draws per-minute counts as an SVG bar chart (oldest left), with
// the maximum on the axis and each bar's count in its tooltip. Inline SVG
// with presentation attributes only: the console's Content-Security-Policy
// allows no inline style.
func barChart(label string, counts []int64) template.HTML {
	const w, h, pad = 600, 120, 20
	var peak int64
	for _, n := range counts {
		peak = max(peak, n)
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="chart" viewBox="0 0 %d %d" width="%d" height="%d" role="img" aria-label="%s per minute, last hour">`,
		w, h+pad, w, h+pad, template.HTMLEscapeString(label))
	fmt.Fprintf(&b, `<line x1="0" y1="%d" x2="%d" y2="%d" stroke="#999"/>`, h, w, h)
	bw := float64(w) / float64(max(len(counts), 1))
	for i, n := range counts {
		if n == 0 {
			continue
		}
		bh := float64(h-4) * float64(n) / float64(peak)
		ago := len(counts) - 1 - i
		fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="#3b6ea5"><title>%d %s, %d min ago</title></rect>`,
			float64(i)*bw+1, float64(h)-bh, bw-2, bh, n, template.HTMLEscapeString(label), ago)
	}
	fmt.Fprintf(&b, `<text x="2" y="12" font-size="11" fill="#444">max %d/min</text>`, peak)
	fmt.Fprintf(&b, `<text x="0" y="%d" font-size="11" fill="#444">-60 min</text>`, h+pad-4)
	fmt.Fprintf(&b, `<text x="%d" y="%d" font-size="11" fill="#444" text-anchor="end">now</text>`, w, h+pad-4)
	b.WriteString(`</svg>`)
	return template.HTML(b.String()) // built from numbers and escaped text only
}
