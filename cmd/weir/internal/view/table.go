// Package view prints weir's /status document as the readable tables of
// `weir status` (and of the demo). It reads only the typed document, so the
// CLI links neither gVisor nor the datapath.
package view

import (
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"weir/cmd/weir/api"
)

// WriteTable prints st as the readable tables of `weir status`: the QoS
// levels with connections and bandwidth against their limits, then each
// virtual server's targets with base weight, each fraction, effective weight,
// open/max connections and health, then the refusals and every non-zero
// counted drop. It returns the first write error.
func WriteTable(w io.Writer, st api.Status) error {
	ew := &errWriter{w: w}
	writeTable(ew, st)
	return ew.err
}

// errWriter keeps the first write error and swallows the writes after it.
type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) Write(p []byte) (int, error) {
	if e.err != nil {
		return len(p), nil
	}
	n, err := e.w.Write(p)
	if err != nil {
		e.err = err
	}
	return n, nil
}

func writeTable(w io.Writer, st api.Status) {
	fmt.Fprintf(w, "weir %s — config generation %d", st.Instance, st.Generation)
	if st.Source != "" {
		fmt.Fprintf(w, " from %s", st.Source)
	}
	fmt.Fprintf(w, ", loaded %s", st.LoadedAt.Format(time.DateTime))
	if st.Draining {
		fmt.Fprint(w, ", DRAINING")
	}
	fmt.Fprintf(w, "\n%d open connections\n", st.Open)
	if st.ReloadError != nil {
		fmt.Fprintf(w, "last reload FAILED at %s: %s\n", st.ReloadError.At.Format(time.DateTime), st.ReloadError.Err)
	}
	if hc := st.HostCapture; hc != nil && hc.Targets > 0 {
		// How the via: host legs are measured (docs/semantics.md).
		fmt.Fprintf(w, "host capture %s", hc.State)
		if hc.Reason != "" {
			fmt.Fprintf(w, " (%s)", hc.Reason)
		}
		fmt.Fprintf(w, ": %d via: host targets, %d flows, %d packets, %d lost (%d in the last interval)\n",
			hc.Targets, hc.Flows, hc.Packets, hc.Dropped, hc.DroppedLastInterval)
	}

	fmt.Fprintln(w, "\nQoS levels")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  LEVEL\tNAME\tCONNS\tMAX\tBANDWIDTH\tMAX B/s\tSTATE")
	for _, l := range st.Levels {
		state := "ok"
		if l.Over {
			state = "OVER"
		}
		if l.Retired {
			state += " (retired)"
		}
		fmt.Fprintf(tw, "  %s\t%s\t%d\t%s\t%s\t%s\t%s\n", l.Level, l.Name, l.Connections,
			limit(l.MaxConnections, l.EnforceConnections), human(l.Bandwidth)+"/s",
			limit(l.MaxBandwidth, l.EnforceBandwidth), state)
	}
	tw.Flush()
	writeQueues(w, st)
	writeClients(w, st.Clients)
	writeUDP(w, st.UDP)
	writeCluster(w, st.Cluster)

	for _, s := range st.Services {
		algo := s.Balancer
		if s.HashBy != "" {
			algo += " by " + s.HashBy
		}
		fmt.Fprintf(w, "\n%s (%s %s port %s, %s)", s.Name, s.Proto, strings.Join(s.VIPs, " "), s.Ports, algo)
		if s.Class != "" {
			fmt.Fprintf(w, " class %s", s.Class)
		}
		if s.Refused > 0 {
			fmt.Fprintf(w, ", %d refused: no target", s.Refused)
		}
		fmt.Fprintln(w)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  TARGET\tROLE\tOPEN/MAX\tWEIGHT\tLOSS\tTIMEOUT\tERROR\tACTION\tFRACTION\tEFFECTIVE\tSTATE\tPICKED\tSKIPPED")
		for _, t := range s.Targets {
			loss, tmo, errs, act, fr := "-", "-", "-", "-", "-"
			if e := t.Explanation; e != nil {
				loss = fmt.Sprintf("%d%% (%s)", e.LossFraction, Tenths(e.LossRatio))
				tmo = fmt.Sprintf("%d%% (%s)", e.TimeoutFraction, Tenths(e.TimeoutRatio))
				if s.Proto == "http" {
					errs = fmt.Sprintf("%d%% (%s of %d)", e.ErrorFraction, Tenths(e.ErrorRatio), e.Responses)
				}
				if e.Action != "" {
					act = fmt.Sprintf("%d%% %s", e.ActionFraction, e.Action)
				}
				fr = fmt.Sprintf("%d%% %s", e.Fraction, e.Winner)
			}
			state := "up"
			switch {
			case t.Ejected:
				state = "ejected until " + t.EjectedUntil.Format(time.TimeOnly)
			case t.Down:
				state = "down until " + t.DownUntil.Format(time.TimeOnly)
			case !t.HealthUp:
				state = "unhealthy"
			case t.SlowStart > 0 && t.SlowStart < 1:
				state = fmt.Sprintf("slow start %.0f%%", t.SlowStart*100)
			}
			max := "∞"
			if t.Max > 0 {
				max = strconv.FormatInt(t.Max, 10)
			}
			fmt.Fprintf(tw, "  %s\t%s\t%d/%s\t%d\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%d\t%d\n", t.Name, t.Role, t.Open, max,
				t.Weight, loss, tmo, errs, act, fr, t.Effective, state, t.Picked, t.SkippedAtLimit)
		}
		tw.Flush()
		writeActionLevels(w, s.Targets)
		writeChecks(w, s.Targets)
		writeSegments(w, s.Targets)
		writeReplies(w, s.Targets)
	}
	if len(st.Refusals) > 0 {
		fmt.Fprintln(w, "\nRefusals")
		for _, r := range st.Refusals {
			fmt.Fprintf(w, "  %s %s: %d\n", r.Level, r.Limit, r.Count)
		}
	}
	if d := countedDrops(st); len(d) > 0 {
		fmt.Fprintln(w, "\nCounted drops")
		for _, l := range d {
			fmt.Fprintf(w, "  %s\n", l)
		}
	}
}

// countedDrops lists every non-zero drop counter of st as "what: n".
func countedDrops(st api.Status) []string {
	var out []string
	add := func(what string, n uint64) {
		if n > 0 {
			out = append(out, fmt.Sprintf("%s: %d", what, n))
		}
	}
	for _, d := range st.Datapath.Dropped {
		add("datapath "+d.Reason, d.Count)
	}
	add("flow table full (flows)", st.Datapath.Flows.Refused)
	add("stack SYNs over the pending-handshake limit", st.Stack.SYNsDroppedInFlight)
	add("stack IP malformed", st.Stack.IPMalformed)
	add("forwarder SYNs admitted without a session (a bug)", st.Forwarder.NoSession)
	for _, d := range st.Forwarder.SNIRefused {
		add("tls ClientHello refused "+d.Reason, d.Count)
	}
	for _, n := range st.NICs {
		for _, d := range n.Dropped {
			add("nic "+n.Name+" "+d.Reason, d.Count)
		}
		for _, e := range n.Errors {
			add("nic "+n.Name+" "+e.Reason+" errors", e.Count)
		}
		if d := n.Device; d != nil {
			add("transport "+n.Name+" queue_full", d.DroppedFull)
			add("transport "+n.Name+" too_big", d.DroppedTooBig)
			add("transport "+n.Name+" write_refused", d.WriteErrors)
		}
	}
	if t := st.TUN; t != nil {
		add("kernel at "+t.Name+" toward weir (TUN queue full)", t.ToWeirDropped)
		add("kernel at "+t.Name+" from weir", t.FromWeirDropped)
		add("kernel at "+t.Name+" toward weir, errors", t.ToWeirErrors)
		add("kernel at "+t.Name+" from weir, errors", t.FromWeirErrors)
	}
	add("log lines", st.Control.DroppedLogLines)
	add("admission events", st.Control.DroppedEvents)
	return out
}

func limit(v int64, enforced bool) string {
	if v <= 0 {
		return "-"
	}
	s := strconv.FormatInt(v, 10)
	if !enforced {
		s += " (log)"
	}
	return s
}

// Tenths prints a ratio in tenths of a percent as a percentage: 25 → "2.5%".
func Tenths(v int) string { return fmt.Sprintf("%d.%d%%", v/10, v%10) }

// human prints a byte count with a binary unit.
func human(n int64) string {
	const unit = 1024
	if n < unit {
		return strconv.FormatInt(n, 10) + " B"
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// writeActionLevels lists, when the service has action levels, each
// target's fraction and weight per level: the default one (connections
// under no policy action) first, then each action's (api.ActionLevel),
// whose new connections are balanced on that level's weights.
func writeActionLevels(w io.Writer, targets []api.Target) {
	var actions []string
	seen := map[string]bool{}
	for _, t := range targets {
		for _, l := range t.Actions {
			if !seen[l.Action] {
				seen[l.Action] = true
				actions = append(actions, l.Action)
			}
		}
	}
	if len(actions) == 0 {
		return
	}
	sort.Strings(actions)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  SERVICE LEVEL\tTARGET\tFRACTION\tEFFECTIVE\tEXACT")
	for _, t := range targets {
		fr := "-"
		if e := t.Explanation; e != nil {
			fr = fmt.Sprintf("%d%%", e.DefaultFraction)
		}
		fmt.Fprintf(tw, "  (no action)\t%s\t%s\t%d\t%s\n", t.Name, fr, t.Effective, exact(t.Exact))
	}
	for _, a := range actions {
		for _, t := range targets {
			for _, l := range t.Actions {
				if l.Action == a {
					fmt.Fprintf(tw, "  %s\t%s\t%d%%\t%d\t%s\n", a, t.Name, l.Fraction, l.Effective, exact(l.Exact))
				}
			}
		}
	}
	tw.Flush()
}

// exact prints an unrounded weight with at most two decimals: 0.75, 40, 1.5.
func exact(v float64) string { return strconv.FormatFloat(math.Round(v*100)/100, 'f', -1, 64) }

// writeSegments lists each target's data segments per direction since
// start (api.Segments), marking the direction the ratios read.
// writeChecks lists each checked target's last health check: its result,
// the reason it failed and the count toward rise or fall.
func writeChecks(w io.Writer, targets []api.Target) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	header := false
	for _, t := range targets {
		c := t.Check
		if c == nil {
			continue
		}
		if !header {
			fmt.Fprintln(tw, "  CHECK\tLAST\tRESULT\tTOWARD")
			header = true
		}
		result, toward := "ok", "fall"
		if !c.OK {
			result = "failed: " + c.Reason
		}
		if !t.HealthUp {
			toward = "rise"
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s %d/%d\n", t.Name, c.At.Format(time.TimeOnly), result, toward, c.Streak, c.Need)
	}
	tw.Flush()
}

func writeSegments(w io.Writer, targets []api.Target) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	header := false
	for _, t := range targets {
		sg := t.Segments
		if sg == nil {
			continue
		}
		if !header {
			fmt.Fprintln(tw, "  SEGMENTS	DIRECTION	DATA	RETRANSMITTED	TIMEOUTS	OUT OF ORDER	SOURCE")
			header = true
		}
		for _, d := range []struct {
			name string
			t    api.DirTotals
		}{{"from_target", sg.FromTarget}, {"to_target", sg.ToTarget}} {
			mark, src := "", d.t.Source
			if d.name == sg.Direction {
				mark = " ←"
			}
			if d.t.Signal != "" {
				src += " (" + d.t.Signal + ")"
			}
			fmt.Fprintf(tw, "  %s\t%s%s\t%d\t%d (%s)\t%d\t%d\t%s\n", t.Name, d.name, mark, d.t.DataSegments, d.t.Retransmitted,
				Tenths(ratioTenths(d.t.Retransmitted, d.t.DataSegments)), d.t.Timeouts, d.t.OutOfOrder, src)
		}
	}
	tw.Flush()
}

// writeReplies lists the reply latency of udp targets' request/response
// sessions (api.ReplyLatency): the last sampling interval's and the total.
func writeReplies(w io.Writer, targets []api.Target) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	header := false
	for _, t := range targets {
		r := t.Replies
		if r == nil {
			continue
		}
		if !header {
			fmt.Fprintln(tw, "  REPLIES\tINTERVAL\tP50\tP99\tTOTAL\tP50\tP99")
			header = true
		}
		fmt.Fprintf(tw, "  %s\t%d\t%s\t%s\t%d\t%s\t%s\n", t.Name, r.Interval.Replies, quantileMs(r.Interval, r.Interval.P50), quantileMs(r.Interval, r.Interval.P99),
			r.Total.Replies, quantileMs(r.Total, r.Total.P50), quantileMs(r.Total, r.Total.P99))
	}
	tw.Flush()
}

// quantileMs is a quantile for the REPLIES table, a dash for an interval
// without replies.
func quantileMs(s api.LatencySummary, ms float64) string {
	if s.Replies == 0 {
		return "-"
	}
	return fmtMs(ms)
}

// fmtMs shows a latency in milliseconds with three significant digits.
func fmtMs(ms float64) string {
	switch {
	case ms < 1:
		return fmt.Sprintf("%.3f ms", ms)
	case ms < 100:
		return fmt.Sprintf("%.3g ms", ms)
	}
	return fmt.Sprintf("%.0f ms", ms)
}

// ratioTenths is num/den in tenths of a percent, 0 for den 0.
func ratioTenths(num, den uint64) int {
	if den == 0 {
		return 0
	}
	return int(num * 1000 / den)
}

// writeQueues lists the queues at the connection limits: length now,
// waits, served, timed out, refused full, mean wait.
func writeQueues(w io.Writer, st api.Status) {
	type row struct {
		level, name string
		q           *api.Queue
	}
	var rows []row
	for _, l := range st.Levels {
		if l.Queue != nil {
			rows = append(rows, row{l.Level, l.Name, l.Queue})
		}
	}
	for _, c := range st.Clients {
		if c.Queue != nil {
			rows = append(rows, row{"client", orInstance(c.Scope), c.Queue})
		}
	}
	if len(rows) == 0 {
		return
	}
	fmt.Fprintln(w, "\nQueues at maxConnections")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  LEVEL\tNAME\tWAITING\tLIMIT\tTIMEOUT\tWAITS\tSERVED\tTIMED OUT\tFULL\tMEAN WAIT")
	for _, r := range rows {
		q := r.q
		mean := "-"
		if left := q.Served + q.TimedOut; left > 0 {
			mean = (time.Duration(q.WaitedSec / float64(left) * float64(time.Second))).Round(time.Millisecond).String()
		}
		fmt.Fprintf(tw, "  %s\t%s\t%d\t%d\t%s\t%d\t%d\t%d\t%d\t%s\n", r.level, r.name, q.Waiting, q.Limit,
			time.Duration(q.TimeoutMs)*time.Millisecond, q.Waits, q.Served, q.TimedOut, q.Full, mean)
	}
	tw.Flush()
}

// writeClients lists the per-client limit tables.
func writeClients(w io.Writer, cs []api.ClientTable) {
	if len(cs) == 0 {
		return
	}
	fmt.Fprintln(w, "\nPer-client limits")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  SCOPE\tPREFIX\tMAX CONNS\tMAX B/s\tCLIENTS\tACTIVE\tSIZE\tREFUSED\tEVICTED\tOVERFLOW")
	for _, c := range cs {
		fmt.Fprintf(tw, "  %s\t/%d /%d\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\n", orInstance(c.Scope), c.PrefixV4, c.PrefixV6,
			limit(c.MaxConnections, c.EnforceConnections), limit(c.MaxBandwidth, c.EnforceBandwidth),
			c.Clients, c.Active, c.Size, c.Refused, c.Evicted, c.Overflow)
	}
	tw.Flush()
}

// writeUDP shows the udp services' sessions, once weir has a udp endpoint
// or has had a session.
func writeUDP(w io.Writer, u api.UDP) {
	if u.Endpoints == 0 && u.Created == 0 {
		return
	}
	fmt.Fprintln(w, "\nUDP sessions")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  OPEN\tENDPOINTS\tCREATED\tREFUSED\tTABLE FULL\tVIP FULL\tDATAGRAMS IN/OUT\tBYTES IN/OUT")
	fmt.Fprintf(tw, "  %d\t%d\t%d\t%d\t%d\t%d\t%d/%d\t%s/%s\n", u.Sessions, u.Endpoints, u.Created, u.Refused,
		u.DroppedFull, u.DroppedVIP, u.DatagramsIn, u.DatagramsOut, human(int64(u.BytesIn)), human(int64(u.BytesOut)))
	tw.Flush()
	fmt.Fprintf(w, "  ended: %d idle, %d after their responses, %d unanswered, %d target error, %d at shutdown\n",
		u.EndedIdle, u.EndedResponses, u.EndedUnanswered, u.EndedError, u.EndedClosed)
}

func orInstance(scope string) string {
	if scope == "" {
		return "(instance)"
	}
	return scope
}
