package view

import (
	"strings"
	"testing"

	"weir/cmd/weir/api"
)

func TestChanges(t *testing.T) {
	prev := api.Status{
		Generation: 1,
		Services: []api.Service{{Name: "shop", Targets: []api.Target{
			{Name: "carol", Weight: 4, Effective: 4, HealthUp: true},
			{Name: "bob", Weight: 2, Effective: 2, HealthUp: true},
		}}},
		Levels:   []api.Level{{Level: "virtual server", Name: "shop", Connections: 3}},
		Refusals: []api.Refusal{{Level: "virtual server", Limit: "maxConnections", Count: 2}},
	}
	if c := Changes(prev, prev); c != nil {
		t.Errorf("same status: %q", c)
	}
	cur := prev
	cur.Generation, cur.ReloadFailures, cur.ReloadError = 2, 1, &api.ReloadError{Err: "line 3: bad"}
	cur.DialFailures = 1
	cur.Services = []api.Service{{Name: "shop", Targets: []api.Target{
		{Name: "carol", Weight: 4, Effective: 2, HealthUp: false, Down: true, SkippedAtLimit: 3, Max: 5,
			Explanation: &api.Explanation{Fraction: 50, Winner: "loss"}},
		{Name: "dave", Weight: 1, Effective: 1},
	}}}
	cur.Levels = []api.Level{{Level: "virtual server", Name: "shop", Connections: 50, Over: true}}
	cur.Refusals = []api.Refusal{{Level: "virtual server", Limit: "maxConnections", Count: 9}, {Level: "balancer", Limit: "targets", Count: 1}}
	got := strings.Join(Changes(prev, cur), "\n")
	for _, want := range []string{
		"configuration reloaded: generation 1 → 2",
		"1 reload(s) rejected: line 3: bad",
		"shop/carol: effective weight 4 → 2 of 4 (fraction 50 %, set by loss)",
		"shop/carol: down after a failed connect",
		"shop/carol: health check fails",
		"shop/carol: skipped 3 time(s) at maxConnections 5",
		"shop/dave: new target (weight 1)",
		"shop/bob: removed",
		"virtual server shop: over a limit (50 connections, 0 B/s)",
		"7 connection(s) refused by virtual server maxConnections",
		"1 connection(s) refused by balancer targets",
		"1 connect(s) to targets failed",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("changes lack %q:\n%s", want, got)
		}
	}
}

func TestHistoryChanges(t *testing.T) {
	h := api.History{
		Targets: []api.TargetSeries{
			{Service: "shop", Target: "carol", At: []int64{1000, 2000}, Weight: []int{4, 4}, Effective: []int{4, 2}},
			{Service: "shop", Target: "bob", At: []int64{1000, 2000}, Weight: []int{2, 2}, Effective: []int{2, 2}},
		},
		Reloads:  []api.ReloadEvent{{At: 500, Generation: 2}, {At: 1500, Generation: 3}},
		Refusals: []api.RefusalSeries{{Level: "instance", Limit: "maxBandwidth", At: []int64{1000, 2000}, Count: []uint64{1, 4}}},
	}
	got := HistoryChanges(h)
	want := []string{"shop/carol: effective weight 4 → 2 of 4", "configuration reloaded: generation 3", "3 connection(s) refused by instance maxBandwidth"}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("got %q\nwant %q", got, want)
	}
	if c := HistoryChanges(api.History{}); c != nil {
		t.Errorf("empty history: %q", c)
	}
	var b strings.Builder
	WriteChanges(&b, h.Now, nil)
	if !strings.Contains(b.String(), "changed since the previous sample:\n  nothing") {
		t.Errorf("nothing changed: %q", b.String())
	}
}
