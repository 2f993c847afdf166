package main

import (
	"fmt"
	"math"
	"slices"
	"strings"
)

// report is the harness's output: every sample, and their summary.
type report struct {
	Date     string    `json:"date"`
	Machine  string    `json:"machine"`
	Note     string    `json:"note"`
	Reps     int       `json:"reps"`
	IperfSec int       `json:"iperf_sec"`
	ConnSec  float64   `json:"conn_sec"`
	Paths    []string  `json:"paths"` // the kernel first
	Tests    []testDef `json:"tests"`
	Samples  []sample  `json:"samples"`
	Summary  []summary `json:"summary"`
	// Appliances are the resource figures of the paths that are processes.
	Appliances []applianceSummary `json:"appliances"`
	// WeirArgs are the extra arguments weir ran with (-weir-args).
	WeirArgs string `json:"weir_args,omitempty"`
	// WeirEnv is the extra environment weir ran with (-weir-env).
	WeirEnv string `json:"weir_env,omitempty"`
	// HAProxyVersion is `haproxy -v`'s first line ("" without HAProxy).
	HAProxyVersion string `json:"haproxy_version,omitempty"`
	// StartRSS is each appliance's resident set before the matrix, after
	// the probe (bytes).
	StartRSS map[string]int64 `json:"start_rss_bytes,omitempty"`
	// Idle is the idle-connection measurement (nil with -idle 0).
	Idle *idleResult `json:"idle,omitempty"`
	// Profiles are weir's CPU profiles (-profile).
	Profiles []profileResult `json:"profiles,omitempty"`
	// UDPRate and UDPLen are the UDP test's iperf3 -b and -l ("" and 0
	// without it).
	UDPRate string `json:"udp_rate,omitempty"`
	UDPLen  int    `json:"udp_len,omitempty"`
}

// stat is a median with its spread over the repetitions.
type stat struct {
	Median float64 `json:"median"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
	N      int     `json:"n"`
}

func statOf(xs []float64) stat {
	if len(xs) == 0 {
		return stat{}
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	m := s[len(s)/2]
	if len(s)%2 == 0 {
		m = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return stat{Median: m, Min: s[0], Max: s[len(s)-1], N: len(s)}
}

// summary is one (test, path) cell.
type summary struct {
	Test   string `json:"test"`
	Path   string `json:"path"`
	Value  stat   `json:"value"` // Gbit/s or conn/s, over the runs without error
	Failed int    `json:"failed_runs"`
	// NA says why the path cannot run the test (no figure); LossPct is
	// a UDP test's receiver loss in per cent over the runs, and Sessions
	// the weir sessions per run (the largest: 1 when every stream stayed
	// one session).
	NA       string `json:"not_applicable,omitempty"`
	LossPct  stat   `json:"loss_percent,omitzero"`
	Sessions uint64 `json:"weir_sessions,omitempty"`
	// Ratio is Value.Median / the kernel's (0 when the kernel has none).
	Ratio float64 `json:"ratio_to_kernel"`
	// RatioHA is Value.Median / HAProxy's of the same run (0 without
	// HAProxy), and the CPU ratios likewise: this path's CPU per GB or per
	// connection over HAProxy's.
	RatioHA    float64 `json:"ratio_to_haproxy,omitempty"`
	CPURatioHA float64 `json:"cpu_ratio_to_haproxy,omitempty"`
	// Connection tests: errors summed over the runs, latency medians of
	// the runs' percentiles (µs).
	Errors     int     `json:"errors,omitempty"`
	ConnectP50 float64 `json:"connect_p50_us,omitempty"`
	ConnectP99 float64 `json:"connect_p99_us,omitempty"`
	TxnP50     float64 `json:"txn_p50_us,omitempty"`
	TxnP99     float64 `json:"txn_p99_us,omitempty"`
	// Appliance CPU seconds per run, and per GB or per connection.
	CPUSec      stat    `json:"cpu_sec"`
	CPUPerGB    float64 `json:"cpu_sec_per_gb,omitempty"`
	CPUPerConnU float64 `json:"cpu_us_per_conn,omitempty"`
	PeakRSS     int64   `json:"peak_rss_bytes,omitempty"` // the largest of the runs
}

// applianceSummary is an appliance's resources over the whole run.
type applianceSummary struct {
	Path       string  `json:"path"`
	CPUSec     float64 `json:"cpu_sec_total"`      // over all its runs
	PeakRSS    int64   `json:"peak_rss_bytes"`     // the largest of any run
	CPUPerGB   float64 `json:"cpu_sec_per_gb"`     // 1 stream
	CPUPerConn float64 `json:"cpu_us_per_conn"`    // c16, client closes first
	CPUPerConS float64 `json:"cpu_us_per_conn_sc"` // c16, server closes first
	StartRSS   int64   `json:"start_rss_bytes"`    // before the matrix
}

// haproxyPath is HAProxy's path name, the yardstick of the ratios.
const haproxyPath = "haproxy"

func (r *report) cell(test, path string) *summary {
	for i := range r.Summary {
		if r.Summary[i].Test == test && r.Summary[i].Path == path {
			return &r.Summary[i]
		}
	}
	return nil
}

// summarize computes Summary and Appliances from Samples.
func (r *report) summarize() {
	r.Summary = nil
	for _, t := range r.Tests {
		for _, p := range r.Paths {
			s := summary{Test: t.ID, Path: p}
			var vals, cpu, cp50, cp99, tp50, tp99, loss []float64
			var cpuTotal, bytes, conns float64
			for _, x := range r.Samples {
				if x.Test != t.ID || x.Path != p {
					continue
				}
				if x.NA != "" {
					s.NA = x.NA
					continue
				}
				if x.Err != "" {
					s.Failed++
					continue
				}
				if u := x.UDP; u != nil {
					loss = append(loss, u.LostPercent)
					s.Sessions = max(s.Sessions, u.Sessions)
				}
				vals = append(vals, x.Value)
				cpu = append(cpu, x.CPUSec)
				cpuTotal += x.CPUSec
				bytes += float64(x.Bytes)
				s.PeakRSS = max(s.PeakRSS, x.PeakRSS)
				if c := x.Conn; c != nil {
					s.Errors += c.Errors
					conns += float64(c.Conns)
					cp50, cp99 = append(cp50, c.ConnectP50), append(cp99, c.ConnectP99)
					tp50, tp99 = append(tp50, c.TxnP50), append(tp99, c.TxnP99)
				}
			}
			s.Value, s.CPUSec, s.LossPct = statOf(vals), statOf(cpu), statOf(loss)
			s.ConnectP50, s.ConnectP99 = statOf(cp50).Median, statOf(cp99).Median
			s.TxnP50, s.TxnP99 = statOf(tp50).Median, statOf(tp99).Median
			if bytes > 0 {
				s.CPUPerGB = cpuTotal / (bytes / 1e9)
			}
			if conns > 0 {
				s.CPUPerConnU = cpuTotal / conns * 1e6
			}
			r.Summary = append(r.Summary, s)
		}
	}
	for i := range r.Summary {
		s := &r.Summary[i]
		if k := r.cell(s.Test, "kernel"); k != nil && k.Value.Median > 0 {
			s.Ratio = s.Value.Median / k.Value.Median
		}
		if h := r.cell(s.Test, haproxyPath); h != nil && s.Path != "kernel" {
			if h.Value.Median > 0 {
				s.RatioHA = s.Value.Median / h.Value.Median
			}
			switch {
			case h.CPUPerGB > 0:
				s.CPURatioHA = s.CPUPerGB / h.CPUPerGB
			case h.CPUPerConnU > 0:
				s.CPURatioHA = s.CPUPerConnU / h.CPUPerConnU
			}
		}
	}
	r.Appliances = nil
	for _, p := range r.Paths {
		if p == "kernel" {
			continue
		}
		a := applianceSummary{Path: p, StartRSS: r.StartRSS[p]}
		for _, x := range r.Samples {
			if x.Path == p {
				a.CPUSec += x.CPUSec
				a.PeakRSS = max(a.PeakRSS, x.PeakRSS)
			}
		}
		if c := r.cell("stream1", p); c != nil {
			a.CPUPerGB = c.CPUPerGB
		}
		if c := r.cell("conn16", p); c != nil {
			a.CPUPerConn = c.CPUPerConnU
		}
		if c := r.cell("conn16-sc", p); c != nil {
			a.CPUPerConS = c.CPUPerConnU
		}
		r.Appliances = append(r.Appliances, a)
	}
}

// markdown renders the report as Markdown tables.
func (r *report) markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# weir end-to-end benchmark, %s\n\n", r.Date)
	fmt.Fprintf(&b, "Machine: %s. %s.\n\n", r.Machine, r.Note)
	fmt.Fprintf(&b, "Topology: client → router → server (three network namespaces, veth pairs). "+
		"kernel = the router's kernel forwards; weir = `weir run` in the router, TUN + VIP; "+
		"%d interleaved repetitions, iperf3 %d s, connection loads %gs each. "+
		"Cells: median [min–max]; ratios are medians over the kernel's median.\n\n",
		r.Reps, r.IperfSec, r.ConnSec)
	if r.WeirArgs != "" {
		fmt.Fprintf(&b, "weir ran with `%s`.\n\n", r.WeirArgs)
	}
	if r.WeirEnv != "" {
		fmt.Fprintf(&b, "weir's extra environment: `%s`.\n\n", r.WeirEnv)
	}

	if r.UDPRate != "" {
		fmt.Fprintf(&b, "UDP: iperf3 -u, 1 stream, client → server, -b %s (near the client's own ceiling; a path slower than the offered rate shows loss), %d-byte datagrams, -w %s (the server's receive buffer); "+
			"the cell is the receiver's throughput with its loss (median over the runs); through weir a udp service on the VIP's iperf3 port, "+
			"each stream one session on one target (/status, checked). HAProxy (mode tcp) and kproxy carry no UDP: their cells say so.\n\n", r.UDPRate, r.UDPLen, udpWindow)
	}
	if r.HAProxyVersion != "" {
		fmt.Fprintf(&b, "haproxy = %s in the router, `mode tcp`, its defaults (threads, maxconn), the server's port the client's; "+
			"\"/ haproxy\" columns are medians over HAProxy's median of the same run.\n\n", r.HAProxyVersion)
	}
	hasHA := slices.Contains(r.Paths, haproxyPath)
	vsHA := func(p string) bool { return hasHA && p != haproxyPath && p != "kernel" }

	// Throughput and connection rate.
	b.WriteString("| test | unit |")
	cols := 0
	for _, p := range r.Paths {
		switch {
		case p == "kernel":
			b.WriteString(" kernel |")
			cols++
		case vsHA(p):
			fmt.Fprintf(&b, " %s | %s / kernel | %s / haproxy |", p, p, p)
			cols += 3
		default:
			fmt.Fprintf(&b, " %s | %s / kernel |", p, p)
			cols += 2
		}
	}
	b.WriteString("\n|---|---|" + strings.Repeat("---:|", cols) + "\n")
	for _, t := range r.Tests {
		fmt.Fprintf(&b, "| %s | %s |", t.Name, t.unit())
		for _, p := range r.Paths {
			c := r.cell(t.ID, p)
			cellText := fmtStat(c.Value, t.Kind != connTest)
			if t.Kind == connTest && c.Value.N > 0 {
				cellText += fmt.Sprintf(" (%d errors)", c.Errors)
			}
			if t.Kind == udpTest && c.LossPct.N > 0 {
				cellText += fmt.Sprintf(" (%.2g %% lost)", c.LossPct.Median)
			}
			if c.NA != "" && c.Value.N == 0 {
				cellText = "— (" + c.NA + ")"
			}
			if c.Failed > 0 {
				cellText += fmt.Sprintf(" (%d runs failed)", c.Failed)
			}
			fmt.Fprintf(&b, " %s |", cellText)
			if p != "kernel" {
				fmt.Fprintf(&b, " %s |", fmtRatio(c.Ratio))
			}
			if vsHA(p) {
				fmt.Fprintf(&b, " %s |", fmtRatio(c.RatioHA))
			}
		}
		b.WriteString("\n")
	}

	// Where each UDP run's datagrams went.
	var udpLines []string
	for _, x := range r.Samples {
		u := x.UDP
		if u == nil || x.Err != "" {
			continue
		}
		line := fmt.Sprintf("- %s rep %d: sent %.2f Gbit/s (%d datagrams), received %.2f, lost %d (%.2g %%), %d of them at the server's socket buffer",
			x.Path, x.Rep, u.SentGbps, u.Packets, u.Gbps, u.Lost, u.LostPercent, u.ServerRcvbuf)
		if u.Sessions > 0 {
			line += fmt.Sprintf("; weir: %d dropped at its TUN queue, %d at its VIP endpoint's buffer, %d relayed, %d session (%d trailing)",
				u.TUNDropped, u.ReceiveDropped, u.DatagramsIn, u.Sessions, u.TrailingSessions)
			// What weir read off its TUN it carried through its stack to
			// the endpoint (relayed or dropped there).
			if read := u.DatagramsIn + u.ReceiveDropped; read > 0 && x.CPUSec > 0 {
				line += fmt.Sprintf("; %.1f CPU s, %.1f µs per datagram it read", x.CPUSec, x.CPUSec/float64(read)*1e6)
			}
		}
		udpLines = append(udpLines, line)
	}
	if len(udpLines) > 0 {
		b.WriteString("\nUDP runs: where the datagrams went (iperf3's counts, the server's kernel Udp RcvbufErrors, weir's TUN tx_dropped and /status)\n\n" + strings.Join(udpLines, "\n") + "\n")
	}

	// Latency.
	b.WriteString("\nLatency, µs (median over the runs of each run's percentile): connect p50 / p99 · transaction p50 / p99\n\n| test |")
	for _, p := range r.Paths {
		fmt.Fprintf(&b, " %s |", p)
	}
	if hasHA {
		for _, p := range r.Paths {
			if vsHA(p) {
				fmt.Fprintf(&b, " %s txn p99 / haproxy |", p)
			}
		}
	}
	b.WriteString("\n|---|")
	for _, p := range r.Paths {
		b.WriteString("---:|")
		if vsHA(p) {
			b.WriteString("---:|")
		}
	}
	b.WriteString("\n")
	for _, t := range r.Tests {
		if t.Kind != connTest {
			continue
		}
		fmt.Fprintf(&b, "| %s |", t.Name)
		for _, p := range r.Paths {
			c := r.cell(t.ID, p)
			fmt.Fprintf(&b, " %s / %s · %s / %s |", fmtUs(c.ConnectP50), fmtUs(c.ConnectP99), fmtUs(c.TxnP50), fmtUs(c.TxnP99))
		}
		if hasHA {
			h := r.cell(t.ID, haproxyPath)
			for _, p := range r.Paths {
				if vsHA(p) {
					ratio := 0.0
					if h.TxnP99 > 0 {
						ratio = r.cell(t.ID, p).TxnP99 / h.TxnP99
					}
					fmt.Fprintf(&b, " %s |", fmtRatio(ratio))
				}
			}
		}
		b.WriteString("\n")
	}

	// Appliance resources.
	if len(r.Appliances) > 0 {
		b.WriteString("\nAppliance resources: CPU seconds (user + system, /proc) per GB the receiver got or µs per completed connection; " +
			"the kernel's forwarding CPU is not attributable to a process\n\n|  |")
		for _, a := range r.Appliances {
			fmt.Fprintf(&b, " %s |", a.Path)
			if vsHA(a.Path) {
				fmt.Fprintf(&b, " %s / haproxy |", a.Path)
			}
		}
		b.WriteString("\n|---|")
		for _, a := range r.Appliances {
			b.WriteString("---:|")
			if vsHA(a.Path) {
				b.WriteString("---:|")
			}
		}
		b.WriteString("\n")
		row := func(name string, f func(a applianceSummary) (string, float64)) {
			fmt.Fprintf(&b, "| %s |", name)
			h := applianceSummary{}
			for _, a := range r.Appliances {
				if a.Path == haproxyPath {
					h = a
				}
			}
			_, hv := f(h)
			for _, a := range r.Appliances {
				text, v := f(a)
				fmt.Fprintf(&b, " %s |", text)
				if vsHA(a.Path) {
					ratio := 0.0
					if hv > 0 {
						ratio = v / hv
					}
					fmt.Fprintf(&b, " %s |", fmtRatio(ratio))
				}
			}
			b.WriteString("\n")
		}
		for _, t := range r.Tests {
			if t.Kind != connTest {
				row("CPU per GB, "+t.Name, func(a applianceSummary) (string, float64) {
					c := r.cell(t.ID, a.Path)
					if c == nil || c.CPUPerGB == 0 {
						return "–", 0
					}
					return fmt.Sprintf("%.2f s", c.CPUPerGB), c.CPUPerGB
				})
			} else {
				row("CPU per connection, "+t.Name, func(a applianceSummary) (string, float64) {
					c := r.cell(t.ID, a.Path)
					if c == nil || c.CPUPerConnU == 0 {
						return "–", 0
					}
					return fmt.Sprintf("%.0f µs", c.CPUPerConnU), c.CPUPerConnU
				})
			}
		}
		row("CPU, whole run", func(a applianceSummary) (string, float64) { return fmt.Sprintf("%.1f s", a.CPUSec), a.CPUSec })
		row("RSS at start (after the probe)", func(a applianceSummary) (string, float64) {
			return fmtMiB(a.StartRSS), float64(a.StartRSS)
		})
		row("peak RSS (largest of any run)", func(a applianceSummary) (string, float64) {
			return fmtMiB(a.PeakRSS), float64(a.PeakRSS)
		})
		b.WriteString("\nPeak RSS during each test, the largest of its runs (the mark is reset to the current RSS before a run, so it includes what earlier runs left resident)\n\n| test |")
		for _, a := range r.Appliances {
			fmt.Fprintf(&b, " %s |", a.Path)
		}
		b.WriteString("\n|---|")
		for range r.Appliances {
			b.WriteString("---:|")
		}
		b.WriteString("\n")
		for _, t := range r.Tests {
			fmt.Fprintf(&b, "| %s |", t.Name)
			for _, a := range r.Appliances {
				fmt.Fprintf(&b, " %s |", fmtMiB(r.cell(t.ID, a.Path).PeakRSS))
			}
			b.WriteString("\n")
		}
	}
	if im := r.Idle; im != nil {
		fmt.Fprintf(&b, "\nIdle spliced connections through weir (each carried one request and response, then silent): %d held (%d failed to open); "+
			"per connection %.1f KiB RSS, %.1f KiB Go heap + stacks in use after a GC (%.1f heap, %.1f stacks), %.2f goroutines; RSS %s before, %s held\n",
			im.Conns, im.Errors, im.RSSKiBPerConn, im.GoKiBPerConn, im.HeapKiBPerConn, im.StackKiBPerConn, im.GoroutinesPerConn, fmtMiB(im.RSSBefore), fmtMiB(im.RSSHeld))
		if im.HeapTop != "" {
			fmt.Fprintf(&b, "\nweir's heap while they are held (%s, in use)\n\n```\n%s```\n", im.HeapFile, im.HeapTop)
		}
	}
	for _, p := range r.Profiles {
		fmt.Fprintf(&b, "\nweir CPU profile, %s rep %d (%s)\n\n", p.Test, p.Rep, p.File)
		if p.Err != "" {
			fmt.Fprintf(&b, "error: %s\n", p.Err)
		} else if p.Top != "" {
			b.WriteString("```\n" + p.Top + "```\n")
		}
	}
	var errs []string
	for _, s := range r.Samples {
		if s.Err != "" && s.NA == "" {
			errs = append(errs, fmt.Sprintf("- %s on %s, rep %d: %s", s.Test, s.Path, s.Rep, s.Err))
		}
		if s.Conn != nil && len(s.Conn.ErrorTexts) > 0 {
			errs = append(errs, fmt.Sprintf("- %s on %s, rep %d: %d errors, e.g. %s", s.Test, s.Path, s.Rep, s.Conn.Errors, strings.Join(s.Conn.ErrorTexts, "; ")))
		}
	}
	if len(errs) > 0 {
		b.WriteString("\nErrors\n\n" + strings.Join(errs, "\n") + "\n")
	}
	return b.String()
}

func fmtStat(s stat, gbit bool) string {
	if s.N == 0 {
		return "–"
	}
	f := func(v float64) string {
		if gbit {
			return fmt.Sprintf("%.2f", v)
		}
		return fmtInt(v)
	}
	if s.N == 1 {
		return f(s.Median)
	}
	return fmt.Sprintf("%s [%s–%s]", f(s.Median), f(s.Min), f(s.Max))
}

// fmtInt prints a rounded count with thin spaces between thousands.
func fmtInt(v float64) string {
	n := int64(math.Round(v))
	s := fmt.Sprint(n)
	var out []byte
	for i := range len(s) {
		if i > 0 && (len(s)-i)%3 == 0 && s[i-1] != '-' {
			out = append(out, ' ')
		}
		out = append(out, s[i])
	}
	return string(out)
}

func fmtRatio(r float64) string {
	if r == 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f", r)
}

func fmtUs(v float64) string {
	if v == 0 {
		return "–"
	}
	return fmtInt(v)
}

func fmtMiB(b int64) string {
	if b == 0 {
		return "–"
	}
	return fmt.Sprintf("%.0f MiB", float64(b)/(1<<20))
}
