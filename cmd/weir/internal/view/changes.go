package view

import (
	"fmt"
	"io"
	"time"

	"weir/cmd/weir/api"
)

// Changes names what differs between two /status documents of the same
// weir, in the order an operator asks: configuration, targets (effective
// weight, down, health, added or removed), limits crossed, refusals and
// failed connects since prev. Nothing changed gives nil.
func Changes(prev, cur api.Status) []string {
	var out []string
	if cur.Generation != prev.Generation {
		out = append(out, fmt.Sprintf("configuration reloaded: generation %d → %d", prev.Generation, cur.Generation))
	}
	if cur.ReloadFailures > prev.ReloadFailures {
		msg := ""
		if cur.ReloadError != nil {
			msg = ": " + cur.ReloadError.Err
		}
		out = append(out, fmt.Sprintf("%d reload(s) rejected%s", cur.ReloadFailures-prev.ReloadFailures, msg))
	}
	if cur.Draining && !prev.Draining {
		out = append(out, "draining: new connections are refused")
	}
	before := map[[2]string]api.Target{}
	for _, s := range prev.Services {
		for _, t := range s.Targets {
			before[[2]string{s.Name, t.Name}] = t
		}
	}
	seen := map[[2]string]bool{}
	for _, s := range cur.Services {
		for _, t := range s.Targets {
			k := [2]string{s.Name, t.Name}
			seen[k] = true
			p, ok := before[k]
			name := s.Name + "/" + t.Name
			if !ok {
				out = append(out, fmt.Sprintf("%s: new target (weight %d)", name, t.Weight))
				continue
			}
			if t.Effective != p.Effective || t.Weight != p.Weight {
				why := ""
				if e := t.Explanation; e != nil && e.Fraction > 0 {
					why = fmt.Sprintf(" (fraction %d %%, set by %s)", e.Fraction, e.Winner)
				}
				out = append(out, fmt.Sprintf("%s: effective weight %d → %d of %d%s", name, p.Effective, t.Effective, t.Weight, why))
			}
			if t.Down != p.Down {
				out = append(out, fmt.Sprintf("%s: %s", name, map[bool]string{true: "down after a failed connect", false: "up again"}[t.Down]))
			}
			if t.Ejected != p.Ejected {
				out = append(out, fmt.Sprintf("%s: %s", name, map[bool]string{true: "ejected after consecutive failures", false: "back from its ejection"}[t.Ejected]))
			}
			if t.HealthUp != p.HealthUp {
				why := ""
				if c := t.Check; c != nil && !c.OK {
					why = " (" + c.Reason + ")"
				}
				out = append(out, fmt.Sprintf("%s: health check %s%s", name, map[bool]string{true: "passes again", false: "fails"}[t.HealthUp], why))
			}
			if d := t.SkippedAtLimit - p.SkippedAtLimit; t.SkippedAtLimit > p.SkippedAtLimit {
				out = append(out, fmt.Sprintf("%s: skipped %d time(s) at maxConnections %d", name, d, t.Max))
			}
		}
	}
	for _, s := range prev.Services {
		for _, t := range s.Targets {
			if !seen[[2]string{s.Name, t.Name}] {
				out = append(out, fmt.Sprintf("%s/%s: removed", s.Name, t.Name))
			}
		}
	}
	over := map[[2]string]bool{}
	for _, l := range prev.Levels {
		over[[2]string{l.Level, l.Name}] = l.Over
	}
	for _, l := range cur.Levels {
		if was, ok := over[[2]string{l.Level, l.Name}]; ok && was != l.Over {
			state := "back under its limits"
			if l.Over {
				state = "over a limit"
			}
			out = append(out, fmt.Sprintf("%s %s: %s (%d connections, %s/s)", l.Level, l.Name, state, l.Connections, human(l.Bandwidth)))
		}
	}
	refused := map[[2]string]uint64{}
	for _, r := range prev.Refusals {
		refused[[2]string{r.Level, r.Limit}] = r.Count
	}
	for _, r := range cur.Refusals {
		if p := refused[[2]string{r.Level, r.Limit}]; r.Count > p {
			out = append(out, fmt.Sprintf("%d connection(s) refused by %s %s", r.Count-p, r.Level, r.Limit))
		}
	}
	if cur.DialFailures > prev.DialFailures {
		out = append(out, fmt.Sprintf("%d connect(s) to targets failed", cur.DialFailures-prev.DialFailures))
	}
	return out
}

// HistoryChanges names what changed between the last two samples of a
// history (the previous sampling interval and the last): effective
// weights, refusals and reloads.
func HistoryChanges(h api.History) []string {
	var out []string
	var prevAt int64 = -1
	for _, t := range h.Targets {
		n := len(t.At)
		if n < 2 {
			continue
		}
		prevAt = max(prevAt, t.At[n-2])
		if t.Effective[n-1] != t.Effective[n-2] || t.Weight[n-1] != t.Weight[n-2] {
			out = append(out, fmt.Sprintf("%s/%s: effective weight %d → %d of %d", t.Service, t.Target, t.Effective[n-2], t.Effective[n-1], t.Weight[n-1]))
		}
	}
	for _, r := range h.Reloads {
		if prevAt >= 0 && r.At > prevAt {
			if r.Error != "" {
				out = append(out, "reload rejected: "+r.Error)
			} else {
				out = append(out, fmt.Sprintf("configuration reloaded: generation %d", r.Generation))
			}
		}
	}
	for _, r := range h.Refusals {
		if n := len(r.Count); n >= 2 && r.Count[n-1] > r.Count[n-2] {
			out = append(out, fmt.Sprintf("%d connection(s) refused by %s %s", r.Count[n-1]-r.Count[n-2], r.Level, r.Limit))
		}
	}
	return out
}

// WriteChanges prints the changes under a heading saying since when;
// nothing changed is said too.
func WriteChanges(w io.Writer, since time.Time, changes []string) error {
	ew := &errWriter{w: w}
	if since.IsZero() {
		fmt.Fprintln(ew, "\nchanged since the previous sample:")
	} else {
		fmt.Fprintf(ew, "\nchanged since %s:\n", since.Format(time.TimeOnly))
	}
	if len(changes) == 0 {
		fmt.Fprintln(ew, "  nothing")
	}
	for _, c := range changes {
		fmt.Fprintln(ew, "  "+c)
	}
	return ew.err
}
