package metrics

import (
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestGrafanaDashboard keeps contrib/grafana/weir.json true to the metric
// table: every metric a panel, annotation or variable queries is in Defs,
// and every label it selects or groups by is one of that metric's labels
// (or Prometheus' own instance and job).
func TestGrafanaDashboard(t *testing.T) {
	b, err := os.ReadFile("../../../../contrib/grafana/weir.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Type    string `json:"type"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Annotations struct {
			List []struct {
				Expr string `json:"expr"`
			} `json:"list"`
		} `json:"annotations"`
		Templating struct {
			List []struct {
				Query any `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("weir.json: %v", err)
	}
	labels := map[string][]string{}
	for _, def := range Defs {
		labels[def.Name] = append([]string{"instance", "job"}, def.Labels...)
	}
	var exprs []string
	graphs := 0
	for _, p := range d.Panels {
		if p.Type != "row" {
			graphs++
			if len(p.Targets) == 0 {
				t.Errorf("panel %q queries nothing", p.Title)
			}
		}
		for _, q := range p.Targets {
			exprs = append(exprs, q.Expr)
		}
	}
	for _, a := range d.Annotations.List {
		exprs = append(exprs, a.Expr)
	}
	for _, v := range d.Templating.List {
		if s, ok := v.Query.(string); ok && strings.Contains(s, "weir_") {
			exprs = append(exprs, s)
		}
	}
	if graphs < 10 {
		t.Fatalf("%d panels: the dashboard lost its panels?", graphs)
	}
	used := map[string]bool{}
	for _, e := range exprs {
		checkExpr(t, e, labels, used)
	}
	// The dashboard shows what the status page shows.
	for _, m := range []string{"weir_target_weight", "weir_target_fraction_percent", "weir_refusals_total",
		"weir_level_bandwidth_bytes_per_second", "weir_level_max_bandwidth_bytes_per_second", "weir_level_connections", "weir_reloads_total"} {
		if !used[m] {
			t.Errorf("the dashboard does not query %s", m)
		}
	}
}

var (
	metricRe   = regexp.MustCompile(`weir_[a-z0-9_]+`)
	selectorRe = regexp.MustCompile(`(weir_[a-z0-9_]+)\{([^}]*)\}`)
	matcherRe  = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)`)
	byRe       = regexp.MustCompile(`\b(?:by|without)\s*\(([^)]*)\)`)
)

func checkExpr(t *testing.T, e string, labels map[string][]string, used map[string]bool) {
	t.Helper()
	names := metricRe.FindAllString(e, -1)
	if len(names) == 0 {
		t.Errorf("query %q reads no weir metric", e)
	}
	for _, n := range names {
		used[n] = true
		if labels[n] == nil {
			t.Errorf("query %q reads %s, which weir does not export (metrics.Defs)", e, n)
		}
	}
	for _, m := range selectorRe.FindAllStringSubmatch(e, -1) {
		for _, l := range matcherRe.FindAllStringSubmatch(m[2], -1) {
			if labels[m[1]] != nil && !slices.Contains(labels[m[1]], l[1]) {
				t.Errorf("query %q selects label %s, which %s does not have (%v)", e, l[1], m[1], labels[m[1]])
			}
		}
	}
	for _, m := range byRe.FindAllStringSubmatch(e, -1) {
		for l := range strings.SplitSeq(m[1], ",") {
			l = strings.TrimSpace(l)
			for _, n := range names {
				if labels[n] != nil && !slices.Contains(labels[n], l) {
					t.Errorf("query %q groups by %s, which %s does not have (%v)", e, l, n, labels[n])
				}
			}
		}
	}
}
