package policy

import (
	"strings"
	"testing"
	"time"
)

// TestAdmitSunOverride is Sun's "you can override these server or
// class-level settings for an individual virtual server": a virtual server
// with maxConnections 5 in a class of 2 gets 5 (limits that only added up
// gave it 2), while the class still counts the sum and refuses its other
// members on it.
func TestAdmitSunOverride(t *testing.T) {
	enf := func(n int64) Limits { return Limits{MaxConnections: n, EnforceConnections: true} }
	cfg := limitsCfg{web: enf(5), gold: enf(2), inst: enf(4)}.build(t)
	a := NewAdmission(cfg, 0)
	web, api := cfg.ServiceByName("web"), cfg.ServiceByName("api")
	var held [5]Ticket
	for i := range held {
		if r, ok := a.Admit(web, &held[i]); !ok {
			t.Fatalf("web connection %d of its own 5 refused: %v", i+1, r)
		}
	}
	// Its own limit still holds for it.
	var tk Ticket
	r, ok := a.Admit(web, &tk)
	if want := (Refusal{Over: Over{LevelVirtualServer, "web", LimitMaxConnections, 5, 5, false, 0, false, 0}}); ok || r != want {
		t.Fatalf("6th web connection: ok=%v %v, want %v", ok, r, want)
	}
	// The class and the instance count web's 5 connections ...
	if s := stat(t, a, LevelClass, "gold"); s.Conns != 5 {
		t.Errorf("gold counts %d connections, want the sum 5", s.Conns)
	}
	if s := stat(t, a, LevelInstance, "weir"); s.Conns != 5 {
		t.Errorf("the instance counts %d connections, want 5", s.Conns)
	}
	// ... and refuse a member without a limit of its own on that sum,
	// naming every limit over.
	r, ok = a.Admit(api, &tk)
	if ok || r.Over != (Over{LevelClass, "gold", LimitMaxConnections, 2, 5, false, 0, false, 0}) {
		t.Fatalf("api with gold at 5 of 2: ok=%v %v, want refused by gold", ok, r)
	}
	if want := `class "gold": maxConnections 2 reached (5 open); instance "weir": maxConnections 4 reached (5 open)`; r.Error() != want {
		t.Errorf("refusal %q, want %q", r.Error(), want)
	}
	for i := 3; i < 5; i++ {
		held[i].Release()
	}
	// Back to 3 of web: gold (2) still refuses api, the instance (4)
	// would not.
	if r, ok := a.Admit(api, &tk); ok || r.Level != LevelClass {
		t.Fatalf("api with gold at 3 of 2: ok=%v %v", ok, r)
	}
	held[2].Release()
	held[1].Release()
	if r, ok := a.Admit(api, &tk); !ok {
		t.Fatalf("api with gold at 1 of 2 refused: %v", r)
	}
	tk.Release()
	held[0].Release()
	for _, s := range a.Snapshot() {
		if s.Conns != 0 {
			t.Errorf("%v %q: %d connections left", s.Level, s.Name, s.Conns)
		}
	}
}

// TestAdmitSunOverrideBandwidth: a virtual server's own maxBandwidth
// replaces its class's for it (the class's burst guard with it); its
// connection limit is a separate setting and still comes from the class.
func TestAdmitSunOverrideBandwidth(t *testing.T) {
	cfg := limitsCfg{
		web:  Limits{MaxBandwidth: 1000, EnforceBandwidth: true},
		gold: Limits{MaxBandwidth: 100, EnforceBandwidth: true, BurstBytes: 100, MaxConnections: 2, EnforceConnections: true},
	}.build(t)
	a := NewAdmission(cfg, 0)
	src := &testBytes{}
	web, api := cfg.ServiceByName("web"), cfg.ServiceByName("api")
	t0 := time.Unix(1_000_000, 0)
	a.Recompute(t0, src)
	src.add("web", 15000) // 500 B/s over the 30 s window
	a.Recompute(t0.Add(100*time.Millisecond), src)
	if s := stat(t, a, LevelClass, "gold"); s.Bandwidth != 500 {
		t.Fatalf("gold reads %d B/s, want web's 500", s.Bandwidth)
	}
	var t1, t2, t3 Ticket
	if r, ok := a.Admit(web, &t1); !ok {
		t.Fatalf("web at 500 of its own 1000 B/s refused: %v", r)
	}
	r, ok := a.Admit(api, &t3)
	if ok || r.Over != (Over{LevelClass, "gold", LimitMaxBandwidth, 100, 500, false, 0, false, 0}) {
		t.Fatalf("api with gold at 500 of 100 B/s: ok=%v %v", ok, r)
	}
	if r.NAlso != 1 || r.Also[0].Limit != LimitBurst {
		t.Errorf("refusal %v: want the empty burst bucket named too", r)
	}
	// Connections are not overridden: gold's 2 holds for web.
	if r, ok := a.Admit(web, &t2); !ok {
		t.Fatalf("second web connection refused: %v", r)
	}
	if r, ok := a.Admit(web, &t3); ok || r.Over != (Over{LevelClass, "gold", LimitMaxConnections, 2, 2, false, 0, false, 0}) {
		t.Fatalf("third web connection: ok=%v %v, want gold's maxConnections 2", ok, r)
	}
	t1.Release()
	t2.Release()
}

// TestAdmitBandwidthRefusesOnReaching is Sun's "additional connections are
// refused, once the server reaches its bandwidth limit": the seed's 5000
// bytes read 166 B/s, and a limit of exactly 166 refuses, as a connection
// limit refuses at n open of n.
func TestAdmitBandwidthRefusesOnReaching(t *testing.T) {
	for _, tt := range []struct {
		limit  int64
		refuse bool
	}{{165, true}, {166, true}, {167, false}} {
		cfg := limitsCfg{web: Limits{MaxBandwidth: tt.limit, EnforceBandwidth: true}}.build(t)
		a := NewAdmission(cfg, 0)
		src := &testBytes{}
		t0 := time.Unix(1_000_000, 0)
		a.Recompute(t0, src)
		src.add("web", 5000)
		a.Recompute(t0.Add(time.Second), src)
		var tk Ticket
		r, ok := a.Admit(cfg.ServiceByName("web"), &tk)
		tk.Release()
		if ok == tt.refuse {
			t.Errorf("limit %d B/s at 166 B/s: admitted %v (%v), want refused %v", tt.limit, ok, r, tt.refuse)
		}
		if tt.limit == 166 {
			if want := `virtual server "web": maxBandwidth 166 B/s reached (measured 166 B/s)`; r.Error() != want {
				t.Errorf("refusal %q, want %q", r.Error(), want)
			}
			// Not enforced, the log line is for exceeding, as Sun's "when
			// the maximum is exceeded": none at exactly the limit.
			if s := stat(t, a, LevelVirtualServer, "web"); s.OverBandwidth {
				t.Error("at exactly the limit the level reads over (exceeded)")
			}
		}
	}
}

// TestRefusalNamesEveryLimit is Sun's "an error page stating which limits
// caused the 503 error and the value of the statistic that triggered the
// limit": every enforced limit over is named, in the order Admit checks
// them, the first one first.
func TestRefusalNamesEveryLimit(t *testing.T) {
	enf := func(n int64) Limits { return Limits{MaxConnections: n, EnforceConnections: true} }
	gold := enf(1)
	gold.MaxBandwidth, gold.EnforceBandwidth = 100, true
	all := Limits{MaxConnections: 1} // logged only: not a cause of the 503
	cfg := limitsCfg{gold: gold, all: all, inst: enf(1)}.build(t)
	a := NewAdmission(cfg, 0)
	src := &testBytes{}
	api := cfg.ServiceByName("api")
	t0 := time.Unix(1_000_000, 0)
	a.Recompute(t0, src)
	var held, tk Ticket
	if r, ok := a.Admit(api, &held); !ok {
		t.Fatal(r)
	}
	src.add("api", 6000)
	a.Recompute(t0.Add(time.Second), src)
	r, ok := a.Admit(api, &tk)
	if ok {
		t.Fatal("admitted over three limits")
	}
	got := r.Limits()
	want := []Over{
		{LevelClass, "gold", LimitMaxBandwidth, 100, 200, false, 0, false, 0},
		{LevelClass, "gold", LimitMaxConnections, 1, 1, false, 0, false, 0},
		{LevelInstance, "weir", LimitMaxConnections, 1, 1, false, 0, false, 0},
	}
	if len(got) != len(want) {
		t.Fatalf("refusal names %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("limit %d: %v, want %v", i, got[i], want[i])
		}
	}
	const text = `class "gold": maxBandwidth 100 B/s exceeded (measured 200 B/s); class "gold": maxConnections 1 reached (1 open); instance "weir": maxConnections 1 reached (1 open)`
	if r.Error() != text {
		t.Errorf("refusal text\n%s\nwant\n%s", r.Error(), text)
	}
	for _, s := range a.Snapshot() {
		if s.Conns != 1 && s.Name != "web" && s.Name != "misc" {
			t.Errorf("%v %q: %d connections, want the held 1", s.Level, s.Name, s.Conns)
		}
	}
	// More than MaxAlso: the rest are counted.
	var many Refusal
	for i := 0; i < MaxAlso+3; i++ {
		many.add(Over{Level: LevelClass, Name: "c", Limit: LimitMaxConnections, Value: 1, Measured: 1})
	}
	if !strings.HasSuffix(many.Error(), "; and 3 more") || len(many.Limits()) != 1+MaxAlso {
		t.Errorf("%d limits over: %q", MaxAlso+4, many.Error())
	}
	held.Release()
}
