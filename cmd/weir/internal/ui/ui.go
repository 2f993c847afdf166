// Package ui is weir's status page: /ui on the admin API draws the
// appliance's recent past (a Recorder's api.History) as plots, per service
// (each target's base and effective weight, the fraction's parts stacked,
// loss per direction, open connections against maxConnections), per QoS
// level (bandwidth and connections against their limits), refusals by limit,
// with reloads marked on the time axis.
//
// The charts are SVG rendered here, on the server, so the page needs no
// chart library and works without script; a few lines of embedded script
// fetch /ui/charts every sampling interval and swap the charts in (live).
// Everything the page uses is in the binary (go:embed): nothing is fetched
// from the network.
package ui

import (
	"bytes"
	_ "embed"
	"fmt"
	"html"
	"net/http"
	"strconv"
	"strings"
	"time"

	"weir/cmd/weir/api"
)

//go:embed page.html
var pageHTML string

//go:embed ui.js
var script []byte

//go:embed ui.css
var style []byte

// Handler serves the page at /ui, its charts alone at /ui/charts (what the
// page's script polls), and its script and style. hist is called per
// request and must be safe for concurrent use. Access control is the
// caller's (the admin API wraps it in its token check).
func Handler(hist func() api.History) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /ui", func(w http.ResponseWriter, r *http.Request) {
		h := hist()
		var charts bytes.Buffer
		Render(&charts, h)
		poll := max(h.Interval, time.Second)
		page := strings.NewReplacer("{{charts}}", charts.String(), "{{poll}}", strconv.FormatInt(poll.Milliseconds(), 10)).Replace(pageHTML)
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		w.Header().Set("Content-Security-Policy", "default-src 'self'; style-src 'self'; script-src 'self'; img-src 'self' data:")
		fmt.Fprint(w, page)
	})
	mux.HandleFunc("GET /ui/charts", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		Render(w, hist())
	})
	mux.HandleFunc("GET /ui/ui.js", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/javascript; charset=utf-8")
		w.Write(script)
	})
	mux.HandleFunc("GET /ui/ui.css", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/css; charset=utf-8")
		w.Write(style)
	})
	return mux
}

// Chart geometry, in SVG user units.
const (
	chartW, chartH = 330, 130
	padL, padR     = 44, 8
	padT, padB     = 8, 18
)

// line is one plotted series.
type line struct {
	name, class string
	v           []float64
	area        bool // a stacked part: filled down to the previous part
}

// chart is one plot: series over the history's shared time axis.
type chart struct {
	id, kind, title, unit string
	at                    []int64
	lines                 []line
	yMax                  float64 // 0: from the data
	attrs                 string  // further data- attributes on the figure
}

// Render writes the charts of h as HTML with inline SVG.
func Render(w interface{ Write([]byte) (int, error) }, h api.History) {
	var b strings.Builder
	t0, t1 := span(h)
	fmt.Fprintf(&b, "<div id=\"charts\" data-samples=\"%d\" data-capacity=\"%d\" data-reloads=\"%d\">\n", samples(h), h.Capacity, len(h.Reloads))
	fmt.Fprintf(&b, "<p class=\"meta\">%s · %d samples kept per series, every %v · %d reload(s) in view</p>\n",
		rangeText(t0, t1), h.Capacity, h.Interval, len(h.Reloads))

	service := ""
	for _, ts := range h.Targets {
		if ts.Service != service {
			if service != "" {
				b.WriteString("</section>\n")
			}
			service = ts.Service
			fmt.Fprintf(&b, "<section class=\"service\" data-service=\"%s\"><h2>service %s</h2>\n", esc(service), esc(service))
		}
		id := slug(ts.Service + "-" + ts.Target)
		attrs := fmt.Sprintf(` data-service="%s" data-target="%s"`, esc(ts.Service), esc(ts.Target))
		fmt.Fprintf(&b, "<div class=\"row\"><h3>target %s</h3>\n", esc(ts.Target))
		parts := []line{
			{name: "loss_part", class: "p-loss", v: ints(ts.LossPart), area: true},
			{name: "timeout_part", class: "p-timeout", v: ints(ts.TimeoutPart), area: true},
			{name: "pressure_part", class: "p-pressure", v: ints(ts.PressurePart), area: true},
			{name: "conn_part", class: "p-conn", v: ints(ts.ConnPart), area: true},
			{name: "min_rate_part", class: "p-minrate", v: ints(ts.MinRatePart), area: true},
		}
		loss := []line{{name: "loss_from_target", class: "s-from", v: tenths(ts.LossFromTarget)}}
		if hasData(ts.LossToTarget) {
			loss = append(loss, line{name: "loss_to_target", class: "s-to", v: tenths(ts.LossToTarget)})
		}
		conns := []line{{name: "open", class: "s-value", v: int64s(ts.Open)}}
		if positive(ts.Max) {
			conns = append(conns, line{name: "max", class: "s-limit", v: int64s(ts.Max)})
		}
		for _, c := range []chart{
			{id: "weight-" + id, kind: "weight", title: "weight: base and effective", at: ts.At, attrs: attrs,
				lines: []line{{name: "weight", class: "s-limit", v: ints(ts.Weight)}, {name: "effective", class: "s-value", v: ints(ts.Effective)}}},
			{id: "fraction-" + id, kind: "fraction", title: "fraction's parts (stacked)", unit: "%", at: ts.At, attrs: attrs, yMax: 100, lines: parts},
			{id: "loss-" + id, kind: "loss", title: "loss ratio by direction", unit: "%", at: ts.At, attrs: attrs, lines: loss},
			{id: "conns-" + id, kind: "connections", title: "open connections / maxConnections", at: ts.At, attrs: attrs, lines: conns},
		} {
			c.render(&b, t0, t1, h.Reloads)
		}
		b.WriteString("</div>\n")
	}
	if service != "" {
		b.WriteString("</section>\n")
	}

	if len(h.Levels) > 0 {
		b.WriteString("<section class=\"levels\"><h2>QoS levels</h2>\n")
		for _, ls := range h.Levels {
			id := slug(ls.Level + "-" + ls.Name)
			attrs := fmt.Sprintf(` data-level="%s" data-name="%s"`, esc(ls.Level), esc(ls.Name))
			fmt.Fprintf(&b, "<div class=\"row\"><h3>%s %s</h3>\n", esc(ls.Level), esc(ls.Name))
			bw := []line{{name: "bandwidth", class: "s-value", v: int64s(ls.Bandwidth)}}
			if positive(ls.MaxBandwidth) {
				bw = append(bw, line{name: "max_bandwidth", class: "s-limit", v: int64s(ls.MaxBandwidth)})
			}
			cn := []line{{name: "connections", class: "s-value", v: int64s(ls.Connections)}}
			if positive(ls.MaxConnections) {
				cn = append(cn, line{name: "max_connections", class: "s-limit", v: int64s(ls.MaxConnections)})
			}
			(&chart{id: "bandwidth-" + id, kind: "bandwidth", title: "bandwidth / maxBandwidth", unit: "B/s", at: ls.At, attrs: attrs, lines: bw}).render(&b, t0, t1, h.Reloads)
			(&chart{id: "lconns-" + id, kind: "level-connections", title: "connections / maxConnections", at: ls.At, attrs: attrs, lines: cn}).render(&b, t0, t1, h.Reloads)
			b.WriteString("</div>\n")
		}
		b.WriteString("</section>\n")
	}

	b.WriteString("<section class=\"refusals\"><h2>refusals by limit (per sample)</h2>\n<div class=\"row\">\n")
	if len(h.Refusals) == 0 {
		b.WriteString("<p class=\"none\">no connection refused</p>\n")
	}
	for _, rs := range h.Refusals {
		attrs := fmt.Sprintf(` data-level="%s" data-limit="%s"`, esc(rs.Level), esc(rs.Limit))
		(&chart{id: "refused-" + slug(rs.Level+"-"+rs.Limit), kind: "refusals", title: rs.Level + ": " + rs.Limit,
			at: rs.At, attrs: attrs, lines: []line{{name: "refused", class: "s-value", v: deltas(rs.Count)}}}).render(&b, t0, t1, h.Reloads)
	}
	b.WriteString("</div>\n</section>\n</div>\n")
	w.Write([]byte(b.String()))
}

// render writes the chart as a figure with an inline SVG. Each series is a
// path whose data- attributes (points, last and largest value) say what it
// shows, for a reader and for tests.
func (c *chart) render(b *strings.Builder, t0, t1 int64, reloads []api.ReloadEvent) {
	stacked := make([]float64, len(c.at))
	top := make([][]float64, len(c.lines)) // each line's upper edge
	yMax := c.yMax
	for i, l := range c.lines {
		top[i] = make([]float64, len(l.v))
		for j, v := range l.v {
			if l.area {
				stacked[j] += v
				v = stacked[j]
			}
			top[i][j] = v
			if c.yMax == 0 {
				yMax = max(yMax, v)
			}
		}
	}
	if c.yMax == 0 {
		yMax = nice(yMax)
	}
	x := func(t int64) float64 {
		if t1 == t0 {
			return padL
		}
		return padL + float64(t-t0)/float64(t1-t0)*(chartW-padL-padR)
	}
	y := func(v float64) float64 { return padT + (1-v/yMax)*(chartH-padT-padB) }

	fmt.Fprintf(b, "<figure class=\"chart\" id=\"%s\" data-chart=\"%s\" data-points=\"%d\"%s><figcaption>%s</figcaption>\n",
		c.id, c.kind, len(c.at), c.attrs, esc(c.title))
	fmt.Fprintf(b, "<svg viewBox=\"0 0 %d %d\" width=\"%d\" height=\"%d\" role=\"img\" aria-label=\"%s\">\n", chartW, chartH, chartW, chartH, esc(c.title))
	// Grid: 0, half and top, with their values.
	for _, f := range []float64{0, 0.5, 1} {
		yy := y(f * yMax)
		fmt.Fprintf(b, "<line class=\"grid\" x1=\"%d\" x2=\"%d\" y1=\"%.1f\" y2=\"%.1f\"/><text class=\"tick\" x=\"%d\" y=\"%.1f\">%s</text>\n",
			padL, chartW-padR, yy, yy, padL-4, yy+3, short(f*yMax, c.unit))
	}
	fmt.Fprintf(b, "<text class=\"tick t-start\" x=\"%d\" y=\"%d\">%s</text><text class=\"tick t-end\" x=\"%d\" y=\"%d\">%s</text>\n",
		padL, chartH-4, clock(t0), chartW-padR, chartH-4, clock(t1))
	for _, r := range reloads {
		if r.At < t0 || r.At > t1 {
			continue
		}
		cls, what := "reload", fmt.Sprintf("reload: generation %d", r.Generation)
		if r.Error != "" {
			cls, what = "reload rejected", "reload rejected: "+r.Error
		}
		xx := x(r.At)
		fmt.Fprintf(b, "<line class=\"%s\" x1=\"%.1f\" x2=\"%.1f\" y1=\"%d\" y2=\"%d\"><title>%s</title></line>\n", cls, xx, xx, padT, chartH-padB, esc(what))
	}
	for i, l := range c.lines {
		var d strings.Builder
		last, most := 0.0, 0.0
		for j, v := range l.v {
			cmd := 'L'
			if j == 0 {
				cmd = 'M'
			}
			fmt.Fprintf(&d, "%c%.1f %.1f", cmd, x(c.at[j]), y(min(top[i][j], yMax)))
			last, most = v, max(most, v)
		}
		if l.area && len(l.v) > 0 {
			// Close the band down along the previous part's upper edge.
			for j := len(l.v) - 1; j >= 0; j-- {
				fmt.Fprintf(&d, "L%.1f %.1f", x(c.at[j]), y(top[i][j]-l.v[j]))
			}
			d.WriteString("Z")
		}
		kind := "line"
		if l.area {
			kind = "area"
		}
		fmt.Fprintf(b, "<path class=\"%s %s\" data-series=\"%s\" data-n=\"%d\" data-last=\"%s\" data-max=\"%s\" d=\"%s\"/>\n",
			kind, l.class, l.name, len(l.v), num(last), num(most), d.String())
	}
	b.WriteString("</svg>\n<div class=\"legend\">")
	for _, l := range c.lines {
		last := 0.0
		if len(l.v) > 0 {
			last = l.v[len(l.v)-1]
		}
		fmt.Fprintf(b, "<span class=\"key %s\">%s %s</span>", l.class, strings.ReplaceAll(l.name, "_", " "), short(last, c.unit))
	}
	b.WriteString("</div></figure>\n")
}

// span is the time axis every chart shares: from the oldest sample of any
// series to the newest.
func span(h api.History) (t0, t1 int64) {
	first := true
	see := func(at []int64) {
		if len(at) == 0 {
			return
		}
		if first || at[0] < t0 {
			t0 = at[0]
		}
		if first || at[len(at)-1] > t1 {
			t1 = at[len(at)-1]
		}
		first = false
	}
	for _, s := range h.Targets {
		see(s.At)
	}
	for _, s := range h.Levels {
		see(s.At)
	}
	for _, s := range h.Refusals {
		see(s.At)
	}
	return t0, t1
}

func samples(h api.History) int {
	n := 0
	for _, s := range h.Targets {
		n = max(n, len(s.At))
	}
	for _, s := range h.Levels {
		n = max(n, len(s.At))
	}
	return n
}

func rangeText(t0, t1 int64) string {
	if t0 == 0 && t1 == 0 {
		return "no samples yet (one arrives every sampling interval)"
	}
	return fmt.Sprintf("%s – %s (%v)", clock(t0), clock(t1), time.Duration(t1-t0)*time.Millisecond)
}

func clock(ms int64) string {
	if ms == 0 {
		return ""
	}
	return time.UnixMilli(ms).Format("15:04:05")
}

// nice rounds a chart's top up to 1, 2 or 5 times a power of ten.
func nice(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := 1.0
	for p*10 <= v {
		p *= 10
	}
	for p > v {
		p /= 10
	}
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

// short formats a tick value compactly: 1.5k, 20M.
func short(v float64, unit string) string {
	s := ""
	switch {
	case v >= 1e9:
		s = strconv.FormatFloat(v/1e9, 'g', 3, 64) + "G"
	case v >= 1e6:
		s = strconv.FormatFloat(v/1e6, 'g', 3, 64) + "M"
	case v >= 1e4:
		s = strconv.FormatFloat(v/1e3, 'g', 3, 64) + "k"
	default:
		s = strconv.FormatFloat(v, 'g', 3, 64)
	}
	if unit == "%" {
		return s + "%"
	}
	return s
}

func num(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }

func esc(s string) string { return html.EscapeString(s) }

// slug makes a name safe in an element id.
func slug(s string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' {
			return r
		}
		return '_'
	}, s)
}

func ints(v []int) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = float64(x)
	}
	return out
}

func int64s(v []int64) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = float64(x)
	}
	return out
}

// tenths turns tenths of a percent into percent, -1 (unknown) into 0.
func tenths(v []int) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = max(float64(x), 0) / 10
	}
	return out
}

// deltas turns running totals into per-sample counts.
func deltas(v []uint64) []float64 {
	out := make([]float64, len(v))
	for i := 1; i < len(v); i++ {
		if v[i] >= v[i-1] {
			out[i] = float64(v[i] - v[i-1])
		}
	}
	return out
}

func hasData(v []int) bool {
	for _, x := range v {
		if x >= 0 {
			return true
		}
	}
	return false
}

func positive(v []int64) bool {
	for _, x := range v {
		if x > 0 {
			return true
		}
	}
	return false
}
