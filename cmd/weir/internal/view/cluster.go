package view

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"weir/cmd/weir/api"
)

// writeCluster prints the cluster section of `weir status`: Redis and the
// mode in force, the members seen with their age, each shared connection
// limit cluster-wide and here, each shared bandwidth cluster-wide and
// here, and the exchange of the targets' samples. Nothing without a
// cluster section.
func writeCluster(w io.Writer, c *api.Cluster) {
	if c == nil {
		return
	}
	reach := "reachable"
	if !c.Reachable {
		reach = "UNREACHABLE"
	}
	fmt.Fprintf(w, "\nCluster %s: instance %s, Redis %s %s, mode %s (%d renewals, %d outages)\n",
		c.Name, c.Instance, c.Redis, reach, c.Mode, c.Renewals, c.Outages)
	if c.LastError != "" {
		fmt.Fprintf(w, "  last error: %s\n", c.LastError)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  MEMBER\tSTARTED\tSEEN")
	for _, m := range c.Members {
		me := ""
		if m.ID == c.Instance {
			me = " (this)"
		}
		fmt.Fprintf(tw, "  %s%s\t%s\t%s ago\n", m.ID, me, m.Started.Format(time.DateTime),
			(time.Duration(m.SeenSeconds * float64(time.Second))).Round(time.Millisecond))
	}
	tw.Flush()
	if len(c.Levels) > 0 {
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  SHARED LIMIT\tNAME\tMAX\tHELD (CLUSTER)\tSHARE HERE\tOPEN HERE\tREFUSED BY SHARE")
		for _, l := range c.Levels {
			name := l.Name
			if l.Service != "" {
				name = l.Service + "/" + l.Name
			}
			held := fmt.Sprint(l.Held)
			if !c.Reachable {
				held = "-"
			}
			fmt.Fprintf(tw, "  %s\t%s\t%d\t%s\t%d\t%d\t%d\n", l.Level, name, l.Limit, held, l.Share, l.Open, l.Refused)
		}
		tw.Flush()
	}
	if len(c.Bandwidth) > 0 {
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  SHARED BANDWIDTH\tNAME\tMAX B/s\tCLUSTER\tHERE")
		for _, b := range c.Bandwidth {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s/s\t%s/s\n", b.Level, b.Name, limit(b.Max, b.Enforced), human(b.Cluster), human(b.Local))
		}
		tw.Flush()
	}
	if len(c.Logged) > 0 {
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  LOGGED LIMIT\tNAME\tOPEN (CLUSTER)\tOPEN HERE")
		for _, l := range c.Logged {
			fmt.Fprintf(tw, "  %s\t%s\t%d\t%d\n", l.Level, l.Name, l.Cluster, l.Local)
		}
		tw.Flush()
	}
	if cl := c.Clients; cl.Admitted+cl.Refused+cl.Fallbacks > 0 {
		fmt.Fprintf(w, "  per-client limits: %d admitted and %d refused by the cluster's count, %d judged here alone, %d errors, %d pending\n",
			cl.Admitted, cl.Refused, cl.Fallbacks, cl.Errors, cl.Pending)
	}
	fmt.Fprintf(w, "  target samples: %d members summed, %d exchanges, %d fallbacks", c.SampleMembers, c.SampleRounds, c.SampleFallbacks)
	if c.SampleError != "" {
		fmt.Fprintf(w, " (last error: %s)", c.SampleError)
	}
	fmt.Fprintln(w)
}
