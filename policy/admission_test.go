package policy

import (
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// limitsCfg builds a compiled config: instance "weir"; class "gold" inside
// class "all"; virtual servers "web" and "api" in gold, "misc" in no class.
type limitsCfg struct {
	inst, all, gold, web, api, misc Limits
	metric                          time.Duration
}

func (l limitsCfg) build(t testing.TB) *Config {
	t.Helper()
	all := &Class{Name: "all", Limits: l.all}
	gold := &Class{Name: "gold", Parent: all, Limits: l.gold}
	vs := func(name string, port uint16, cl *Class, lim Limits) *VirtualServer {
		return &VirtualServer{Name: name, Class: cl, Limits: lim, Ports: PortRange{port, port},
			VIPs: []netip.Addr{netip.MustParseAddr("10.0.0.1")}}
	}
	c, err := Compile(&Config{
		Instance: Instance{Limits: l.inst, MetricInterval: l.metric},
		Classes:  []*Class{all, gold},
		Services: []*VirtualServer{vs("web", 80, gold, l.web), vs("api", 81, gold, l.api), vs("misc", 82, nil, l.misc)},
	})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// testBytes is a ByteTotals for tests: running byte totals by virtual server
// name, as the datapath's meters keep them. Safe for concurrent use.
type testBytes struct {
	mu sync.Mutex
	m  map[string]uint64
}

func (b *testBytes) add(name string, n uint64) {
	b.mu.Lock()
	if b.m == nil {
		b.m = map[string]uint64{}
	}
	b.m[name] += n
	b.mu.Unlock()
}

func (b *testBytes) ServiceBytes(name string) (uint64, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	n, ok := b.m[name]
	return n, ok
}

func stat(t *testing.T, a *Admission, kind LevelKind, name string) LevelStat {
	t.Helper()
	for _, s := range a.Snapshot() {
		if s.Level == kind && s.Name == name {
			return s
		}
	}
	t.Fatalf("no %v %q in the snapshot", kind, name)
	return LevelStat{}
}

func drain(a *Admission) []Event {
	var out []Event
	for {
		select {
		case e := <-a.Events():
			out = append(out, e)
		default:
			return out
		}
	}
}

// TestAdmitSunBandwidth is the seed's example with an enforced limit of
// 100 B/s: 5000 bytes at t = 1 s read 166 B/s, which refuses new connections
// until the sample ages out of the 30 s window.
func TestAdmitSunBandwidth(t *testing.T) {
	cfg := limitsCfg{web: Limits{MaxBandwidth: 100, EnforceBandwidth: true}}.build(t)
	a := NewAdmission(cfg, 0)
	src := &testBytes{}
	web := cfg.ServiceByName("web")
	t0 := time.Unix(1_000_000, 0)
	var conn Ticket
	if r, ok := a.Admit(web, &conn); !ok {
		t.Fatalf("idle server refused: %v", r)
	}
	for at := time.Duration(0); at <= 33*time.Second; at += 100 * time.Millisecond {
		if at == time.Second {
			src.add("web", 5000)
			conn.Release()
		}
		a.Recompute(t0.Add(at), src)
		var tk Ticket
		r, ok := a.Admit(web, &tk)
		tk.Release()
		switch {
		case at >= time.Second && at <= 30*time.Second:
			want := Refusal{LevelVirtualServer, "web", LimitMaxBandwidth, 100, 166, false, 0}
			if ok || r != want {
				t.Fatalf("at %v: ok=%v %v, want refused %v", at, ok, r, want)
			}
		case at >= 32*time.Second || at < time.Second:
			if !ok {
				t.Fatalf("at %v: refused %v", at, r)
			}
		}
	}
	const want = `virtual server "web": maxBandwidth 100 B/s exceeded (measured 166 B/s)`
	if got := (Refusal{LevelVirtualServer, "web", LimitMaxBandwidth, 100, 166, false, 0}).Error(); got != want {
		t.Errorf("refusal text %q, want %q", got, want)
	}
	if s := stat(t, a, LevelInstance, "weir"); s.Bytes != 5000 || s.Conns != 0 {
		t.Errorf("instance: %+v, want 5000 bytes and no connections", s)
	}
}

// TestAdmitLevels checks that each level's enforced limit refuses, names the
// level, and leaves no count behind at the levels checked before it.
func TestAdmitLevels(t *testing.T) {
	enfConns := func(n int64) Limits { return Limits{MaxConnections: n, EnforceConnections: true} }
	tests := []struct {
		name   string
		limits limitsCfg
		open   []string // services admitted first
		try    string
		want   Refusal
	}{
		{"virtual server connections", limitsCfg{web: enfConns(2), gold: enfConns(5)}, []string{"web", "web"}, "web",
			Refusal{LevelVirtualServer, "web", LimitMaxConnections, 2, 2, false, 0}},
		{"class sums its virtual servers", limitsCfg{web: enfConns(5), gold: enfConns(3)}, []string{"web", "api", "api"}, "web",
			Refusal{LevelClass, "gold", LimitMaxConnections, 3, 3, false, 0}},
		{"parent class", limitsCfg{gold: enfConns(9), all: enfConns(2)}, []string{"api", "web"}, "web",
			Refusal{LevelClass, "all", LimitMaxConnections, 2, 2, false, 0}},
		{"instance counts classless services", limitsCfg{inst: enfConns(3)}, []string{"misc", "web", "api"}, "misc",
			Refusal{LevelInstance, "weir", LimitMaxConnections, 3, 3, false, 0}},
		{"the tighter lower level trips first", limitsCfg{web: enfConns(1), inst: enfConns(1)}, []string{"web"}, "web",
			Refusal{LevelVirtualServer, "web", LimitMaxConnections, 1, 1, false, 0}},
		{"not enforced never refuses", limitsCfg{web: Limits{MaxConnections: 1}, inst: enfConns(4)}, []string{"web", "web", "web"}, "web",
			Refusal{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := tt.limits.build(t)
			a := NewAdmission(cfg, 0)
			before := map[string]int64{}
			for _, n := range tt.open {
				var tk Ticket
				if r, ok := a.Admit(cfg.ServiceByName(n), &tk); !ok {
					t.Fatalf("admitting %s: %v", n, r)
				}
			}
			for _, s := range a.Snapshot() {
				before[s.Name] = s.Conns
			}
			var tk Ticket
			r, ok := a.Admit(cfg.ServiceByName(tt.try), &tk)
			if tt.want == (Refusal{}) {
				if !ok {
					t.Fatalf("refused: %v", r)
				}
				return
			}
			if ok || r != tt.want {
				t.Fatalf("ok=%v %v, want refused %v", ok, r, tt.want)
			}
			if tk.Admitted() {
				t.Error("refused ticket holds a connection")
			}
			for _, s := range a.Snapshot() {
				if s.Conns != before[s.Name] {
					t.Errorf("%v %q: %d connections after the refusal, %d before", s.Level, s.Name, s.Conns, before[s.Name])
				}
			}
		})
	}
}

// TestAdmitClassBandwidthIsTheSum feeds two virtual servers of a class and
// checks the class (and instance) window sees their exact sum at once.
func TestAdmitClassBandwidthIsTheSum(t *testing.T) {
	cfg := limitsCfg{gold: Limits{MaxBandwidth: 100, EnforceBandwidth: true}, metric: 10 * time.Second}.build(t)
	a := NewAdmission(cfg, 0)
	src := &testBytes{}
	t0 := time.Unix(0, 0)
	a.Recompute(t0, src)
	var w, p Ticket
	a.Admit(cfg.ServiceByName("web"), &w)
	a.Admit(cfg.ServiceByName("api"), &p)
	src.add("web", 600)
	src.add("api", 900)
	a.Recompute(t0.Add(100*time.Millisecond), src)
	for _, c := range []struct {
		kind LevelKind
		name string
		rate int64
	}{{LevelVirtualServer, "web", 60}, {LevelVirtualServer, "api", 90}, {LevelClass, "gold", 150}, {LevelClass, "all", 150}, {LevelInstance, "weir", 150}} {
		if s := stat(t, a, c.kind, c.name); s.Bandwidth != c.rate {
			t.Errorf("%v %s: %d B/s, want %d", c.kind, c.name, s.Bandwidth, c.rate)
		}
	}
	var tk Ticket
	r, ok := a.Admit(cfg.ServiceByName("web"), &tk)
	if want := (Refusal{LevelClass, "gold", LimitMaxBandwidth, 100, 150, false, 0}); ok || r != want {
		t.Errorf("ok=%v %v, want %v", ok, r, want)
	}
	if _, ok := a.Admit(cfg.ServiceByName("misc"), &tk); !ok {
		t.Error("a service outside the class was refused")
	}
}

// TestAdmitConcurrent hammers Admit and Release from many goroutines and
// checks that no level ever holds more than its enforced limit, and that
// every count returns to zero.
func TestAdmitConcurrent(t *testing.T) {
	const webMax, goldMax, instMax = 5, 8, 11
	cfg := limitsCfg{
		web:  Limits{MaxConnections: webMax, EnforceConnections: true},
		gold: Limits{MaxConnections: goldMax, EnforceConnections: true},
		inst: Limits{MaxConnections: instMax, EnforceConnections: true},
	}.build(t)
	a := NewAdmission(cfg, 0)
	services := []*VirtualServer{cfg.ServiceByName("web"), cfg.ServiceByName("api"), cfg.ServiceByName("misc")}
	var inWeb, inGold, inInst, admitted, refused atomic.Int64
	var bad atomic.Value
	check := func(what string, n, limit int64) {
		if n > limit {
			bad.Store(what)
		}
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Add(1)
	go func() { // the admin API reading while connections come and go
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			for _, s := range a.Snapshot() {
				if s.Limits.MaxConnections > 0 {
					check(s.Name+" snapshot", s.Conns, s.Limits.MaxConnections)
				}
			}
		}
	}()
	const nWorkers = 16
	var workers, filled sync.WaitGroup
	filled.Add(nWorkers)
	for g := 0; g < nWorkers; g++ {
		workers.Add(1)
		go func(g int) {
			defer workers.Done()
			// Phase 1: every worker holds one connection to each service
			// until all have tried, so 16 try for web's 5 places at once and
			// refusals are certain however the goroutines are scheduled.
			var held [3]Ticket
			for i, vs := range services {
				if _, ok := a.Admit(vs, &held[i]); ok {
					admitted.Add(1)
				} else {
					refused.Add(1)
				}
			}
			filled.Done()
			filled.Wait()
			for i := range held {
				held[i].Release()
			}
			// Phase 2: hammer.
			for i := 0; i < 3000; i++ {
				vs := services[(g+i)%len(services)]
				var tk Ticket
				if _, ok := a.Admit(vs, &tk); !ok {
					refused.Add(1)
					continue
				}
				admitted.Add(1)
				if vs.Name == "web" {
					check("web", inWeb.Add(1), webMax)
				}
				if vs.Class != nil {
					check("gold", inGold.Add(1), goldMax)
				}
				check("instance", inInst.Add(1), instMax)
				runtime.Gosched() // hold the connection while others try
				if vs.Name == "web" {
					inWeb.Add(-1)
				}
				if vs.Class != nil {
					inGold.Add(-1)
				}
				inInst.Add(-1)
				tk.Release()
				tk.Release() // idempotent
			}
		}(g)
	}
	workers.Wait()
	close(stop)
	wg.Wait()
	if v := bad.Load(); v != nil {
		t.Fatalf("%s exceeded its enforced limit", v)
	}
	if admitted.Load() == 0 || refused.Load() == 0 {
		t.Errorf("admitted %d refused %d: the test did not exercise both paths", admitted.Load(), refused.Load())
	}
	for _, s := range a.Snapshot() {
		if s.Conns != 0 {
			t.Errorf("%v %q: %d connections left after every release", s.Level, s.Name, s.Conns)
		}
	}
}

// TestReloadCarriesOver checks that a reload keeps counters and windows by
// name, that connections admitted under the old config count against the new
// limits and are released correctly, and that a removed level with open
// connections is kept until they close.
func TestReloadCarriesOver(t *testing.T) {
	old := limitsCfg{web: Limits{MaxConnections: 10, EnforceConnections: true}, metric: 10 * time.Second}.build(t)
	a := NewAdmission(old, 0)
	src := &testBytes{}
	t0 := time.Unix(0, 0)
	a.Recompute(t0, src)
	tickets := make([]Ticket, 3)
	for i := range tickets {
		if r, ok := a.Admit(old.ServiceByName("web"), &tickets[i]); !ok {
			t.Fatal(r)
		}
		src.add("web", 1000)
	}
	var apiConn Ticket
	a.Admit(old.ServiceByName("api"), &apiConn)
	a.Recompute(t0.Add(100*time.Millisecond), src)
	if s := stat(t, a, LevelVirtualServer, "web"); s.Bandwidth != 300 || s.Conns != 3 {
		t.Fatalf("before the reload: %+v", s)
	}

	// The new config lowers web's limit to 3 and drops api.
	nw := limitsCfg{web: Limits{MaxConnections: 3, EnforceConnections: true}, metric: 10 * time.Second}.build(t)
	nw.Services = nw.Services[:1]
	nw.Services[0].Limits.MaxConnections = 3
	a.Apply(nw)
	a.Recompute(t0.Add(200*time.Millisecond), src)
	s := stat(t, a, LevelVirtualServer, "web")
	if s.Conns != 3 || s.Bandwidth != 300 || s.Bytes != 3000 || s.Limits.MaxConnections != 3 {
		t.Fatalf("after the reload web is %+v, want 3 connections, 300 B/s, 3000 bytes, limit 3", s)
	}
	var tk Ticket
	r, ok := a.Admit(nw.ServiceByName("web"), &tk)
	if want := (Refusal{LevelVirtualServer, "web", LimitMaxConnections, 3, 3, false, 0}); ok || r != want {
		t.Fatalf("old connections not counted against the new limit: ok=%v %v", ok, r)
	}
	// A VirtualServer pointer from the old config is matched by name.
	if r, ok := a.Admit(old.ServiceByName("web"), &tk); ok || r.Limit != LimitMaxConnections {
		t.Fatalf("old pointer: ok=%v %v", ok, r)
	}
	if api := stat(t, a, LevelVirtualServer, "api"); !api.Retired || api.Conns != 1 {
		t.Errorf("api, removed with an open connection: %+v", api)
	}
	src.add("web", 500) // the service's bytes count on its level, carried by name
	a.Recompute(t0.Add(300*time.Millisecond), src)
	if s := stat(t, a, LevelVirtualServer, "web"); s.Bandwidth != 350 {
		t.Errorf("web after old-ticket traffic: %d B/s, want 350", s.Bandwidth)
	}
	for i := range tickets {
		tickets[i].Release()
		tickets[i].Release()
	}
	apiConn.Release()
	if s := stat(t, a, LevelVirtualServer, "web"); s.Conns != 0 {
		t.Errorf("web after releasing the old tickets: %d connections", s.Conns)
	}
	if s := stat(t, a, LevelInstance, "weir"); s.Conns != 0 {
		t.Errorf("instance after releasing every ticket: %d connections", s.Conns)
	}
	if r, ok := a.Admit(nw.ServiceByName("web"), &tk); !ok {
		t.Errorf("refused after the old connections closed: %v", r)
	}
	tk.Release()
	a.Apply(nw) // api has no connections left: pruned
	for _, s := range a.Snapshot() {
		if s.Name == "api" {
			t.Errorf("drained retired level still listed: %+v", s)
		}
	}
}

// TestReloadRevivesRetired: a level removed with open connections and brought
// back by a later config is the same record, so its count stays exact.
func TestReloadRevivesRetired(t *testing.T) {
	full := limitsCfg{api: Limits{MaxConnections: 1, EnforceConnections: true}}.build(t)
	a := NewAdmission(full, 0)
	var tk Ticket
	a.Admit(full.ServiceByName("api"), &tk)
	partial := limitsCfg{}.build(t)
	partial.Services = partial.Services[:1]
	a.Apply(partial)
	again := limitsCfg{api: Limits{MaxConnections: 1, EnforceConnections: true}}.build(t)
	a.Apply(again)
	var t2 Ticket
	if r, ok := a.Admit(again.ServiceByName("api"), &t2); ok || r.Measured != 1 {
		t.Fatalf("revived level lost its connection: ok=%v %v", ok, r)
	}
	tk.Release()
	if r, ok := a.Admit(again.ServiceByName("api"), &t2); !ok {
		t.Fatalf("refused after release: %v", r)
	}
}

// TestEventsOncePerCrossing checks that a limit that is only logged yields
// one event when crossed and one when back under, not one per connection.
func TestEventsOncePerCrossing(t *testing.T) {
	cfg := limitsCfg{
		web:    Limits{MaxConnections: 2, MaxBandwidth: 100},
		metric: time.Second,
	}.build(t)
	a := NewAdmission(cfg, 0)
	src := &testBytes{}
	web := cfg.ServiceByName("web")
	t0 := time.Unix(100, 0)
	a.Recompute(t0, src)
	tickets := make([]Ticket, 6)
	for i := range tickets {
		if r, ok := a.Admit(web, &tickets[i]); !ok {
			t.Fatalf("not-enforced limit refused: %v", r)
		}
	}
	ev := drain(a)
	want := Event{At: t0, Level: LevelVirtualServer, Name: "web", Limit: LimitMaxConnections, Value: 2, Measured: 3, Over: true}
	if len(ev) != 1 || ev[0] != want {
		t.Fatalf("after 6 connections over a limit of 2: %v, want just %v", ev, want)
	}
	if got, w := ev[0].String(), `virtual server "web": maxConnections 2 reached (3 open), not enforced`; got != w {
		t.Errorf("event text %q, want %q", got, w)
	}
	a.Recompute(t0.Add(100*time.Millisecond), src)
	if ev := drain(a); len(ev) != 0 {
		t.Fatalf("recompute while still over: %v", ev)
	}
	for i := 0; i < 4; i++ {
		tickets[i].Release()
	}
	a.Recompute(t0.Add(200*time.Millisecond), src)
	ev = drain(a)
	if len(ev) != 1 || ev[0].Over || ev[0].Measured != 2 || ev[0].Limit != LimitMaxConnections {
		t.Fatalf("back at 2 connections: %v, want one under event", ev)
	}
	if got, w := ev[0].String(), `virtual server "web": back under maxConnections 2 (2 open)`; got != w {
		t.Errorf("event text %q, want %q", got, w)
	}

	// Bandwidth: 500 bytes in a 1 s window is 500 B/s, over 100 for as long
	// as the sample is in the window, then back under: two events.
	src.add("web", 500)
	var bw []Event
	for at := 300 * time.Millisecond; at <= 3*time.Second; at += 100 * time.Millisecond {
		a.Recompute(t0.Add(at), src)
		bw = append(bw, drain(a)...)
	}
	if len(bw) != 2 || !bw[0].Over || bw[0].Limit != LimitMaxBandwidth || bw[0].Measured != 500 ||
		bw[1].Over || bw[1].Measured != 0 || !bw[1].At.Equal(t0.Add(1300*time.Millisecond)) {
		t.Fatalf("bandwidth events %v, want one over at 500 B/s and one under at 1.3 s, when the sample is 1 s old", bw)
	}
	if st := stat(t, a, LevelVirtualServer, "web"); st.OverBandwidth || st.OverConns {
		t.Errorf("snapshot still over: %+v", st)
	}
}

func TestEventsBufferBounded(t *testing.T) {
	cfg := limitsCfg{web: Limits{MaxConnections: 1}, api: Limits{MaxConnections: 1}, misc: Limits{MaxConnections: 1}}.build(t)
	a := NewAdmission(cfg, 1)
	for _, n := range []string{"web", "web", "api", "api", "misc", "misc"} {
		var tk Ticket
		a.Admit(cfg.ServiceByName(n), &tk)
	}
	if ev := drain(a); len(ev) != 1 || ev[0].Name != "web" {
		t.Errorf("events %v, want web's alone", ev)
	}
	if d := a.DroppedEvents(); d != 2 {
		t.Errorf("dropped %d, want 2", d)
	}
}

// TestBurstGuard shows the seed's hole (an idle window lets a client use many
// times the limit) and the token bucket closing it.
func TestBurstGuard(t *testing.T) {
	for _, tt := range []struct {
		name  string
		burst int64
	}{{"window only: the spike is admitted", 0}, {"burst guard: refused", 5000}} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := limitsCfg{web: Limits{MaxBandwidth: 1000, EnforceBandwidth: true, BurstBytes: tt.burst}}.build(t)
			a := NewAdmission(cfg, 0)
			src := &testBytes{}
			web := cfg.ServiceByName("web")
			t0 := time.Unix(0, 0)
			for at := time.Duration(0); at < 29*time.Second; at += 100 * time.Millisecond {
				a.Recompute(t0.Add(at), src) // idle
			}
			var conn Ticket
			if r, ok := a.Admit(web, &conn); !ok {
				t.Fatal(r)
			}
			src.add("web", 20000) // 20 times the limit in 100 ms; the window reads 666 B/s
			a.Recompute(t0.Add(29*time.Second), src)
			if s := stat(t, a, LevelVirtualServer, "web"); s.Bandwidth != 666 {
				t.Fatalf("window %d B/s, want 666", s.Bandwidth)
			}
			var tk Ticket
			r, ok := a.Admit(web, &tk)
			if tt.burst == 0 {
				if !ok {
					t.Fatalf("refused without a burst guard: %v", r)
				}
				return
			}
			want := Refusal{LevelVirtualServer, "web", LimitBurst, 5000, -5000, false, 0}
			if ok || r != want {
				t.Fatalf("ok=%v %v, want %v", ok, r, want)
			}
			if got, w := r.Error(), `virtual server "web": burst 5000 B exhausted (bucket -5000 B)`; got != w {
				t.Errorf("text %q, want %q", got, w)
			}
			// The debt (bounded at one burst) is repaid at 1000 B/s: still
			// empty at 34 s, admitting again after 5 s.
			for at := 29*time.Second + 100*time.Millisecond; at <= 34*time.Second; at += 100 * time.Millisecond {
				a.Recompute(t0.Add(at), src)
			}
			if _, ok := a.Admit(web, &tk); ok {
				t.Fatalf("admitted with bucket %d", stat(t, a, LevelVirtualServer, "web").BurstTokens)
			}
			a.Recompute(t0.Add(34*time.Second+100*time.Millisecond), src)
			if r, ok := a.Admit(web, &tk); !ok {
				t.Fatalf("still refused after the debt was repaid: %v", r)
			}
			if s := stat(t, a, LevelVirtualServer, "web"); s.BurstTokens != 100 {
				t.Errorf("bucket %d B, want 100", s.BurstTokens)
			}
		})
	}
}

func TestBurstRefillExact(t *testing.T) {
	// 166 B/s refilled every 100 ms is 16.6 B a step: the remainder carries.
	cfg := limitsCfg{inst: Limits{MaxBandwidth: 166, BurstBytes: 1 << 20}}.build(t)
	a := NewAdmission(cfg, 0)
	src := &testBytes{}
	t0 := time.Unix(0, 0)
	a.Recompute(t0, src)
	src.add("misc", 1<<20)                         // misc is in no class: its bytes reach the instance directly
	a.Recompute(t0.Add(100*time.Millisecond), src) // 16 refilled (16.6), then drained
	base := stat(t, a, LevelInstance, "weir").BurstTokens
	for at := 200 * time.Millisecond; at <= 10100*time.Millisecond; at += 100 * time.Millisecond {
		a.Recompute(t0.Add(at), src)
	}
	if got := stat(t, a, LevelInstance, "weir").BurstTokens - base; got != 1660 {
		t.Errorf("10 s of refill at 166 B/s: %d B, want 1660", got)
	}
}

func TestAdmitUnknownService(t *testing.T) {
	cfg := limitsCfg{inst: Limits{MaxConnections: 1, EnforceConnections: true}}.build(t)
	a := NewAdmission(cfg, 0)
	var tk Ticket
	if _, ok := a.Admit(&VirtualServer{Name: "nowhere"}, &tk); !ok {
		t.Fatal("unknown service refused below the instance limit")
	}
	r, ok := a.Admit(nil, &Ticket{})
	if want := (Refusal{LevelInstance, "weir", LimitMaxConnections, 1, 1, false, 0}); ok || r != want {
		t.Errorf("ok=%v %v, want %v", ok, r, want)
	}
	// Admitting into a held ticket releases the previous connection first.
	if _, ok := a.Admit(nil, &tk); !ok {
		t.Error("re-admitting a held ticket counted the connection twice")
	}
}

func TestKindsMarshalText(t *testing.T) {
	for _, m := range []interface{ MarshalText() ([]byte, error) }{LevelVirtualServer, LimitBurst, WinLossTimeout} {
		b, err := m.MarshalText()
		if err != nil || string(b) != m.(interface{ String() string }).String() {
			t.Errorf("%v: %q %v", m, b, err)
		}
	}
}

func TestKindStrings(t *testing.T) {
	for got, want := range map[string]string{
		LevelInstance.String(): "instance", LevelClass.String(): "class", LevelVirtualServer.String(): "virtual server",
		LevelKind(9).String(): "level(9)", LimitMaxConnections.String(): "maxConnections",
		LimitMaxBandwidth.String(): "maxBandwidth", LimitBurst.String(): "burst", LimitKind(7).String(): "limit(7)",
		(Refusal{LevelClass, "gold", LimitMaxConnections, 100, 100, false, 0}).String():                                                     `class "gold": maxConnections 100 reached (100 open)`,
		(Event{Level: LevelInstance, Name: "weir", Limit: LimitMaxBandwidth, Value: 10, Measured: 20, Over: true, Enforced: true}).String(): `instance "weir": maxBandwidth 10 B/s exceeded (measured 20 B/s), enforced`,
	} {
		if got != want {
			t.Errorf("%q, want %q", got, want)
		}
	}
}

func TestAdmitDoesNotAllocate(t *testing.T) {
	cfg := limitsCfg{
		web:  Limits{MaxConnections: 1, EnforceConnections: true},
		gold: Limits{MaxBandwidth: 1 << 30, EnforceBandwidth: true, BurstBytes: 1 << 20},
	}.build(t)
	a := NewAdmission(cfg, 0)
	web := cfg.ServiceByName("web")
	var tk, other Ticket
	if n := testing.AllocsPerRun(1000, func() {
		a.Admit(web, &tk)
		a.Admit(web, &other) // refused: web is at its limit
		tk.Release()
	}); n != 0 {
		t.Errorf("%v allocations per admit, refusal and release", n)
	}
	// The recompute step reads the byte totals without allocating either.
	src := &testBytes{}
	src.add("web", 1)
	now := time.Unix(0, 0)
	if n := testing.AllocsPerRun(100, func() {
		now = now.Add(100 * time.Millisecond)
		src.add("web", 100)
		a.Recompute(now, src)
	}); n != 0 {
		t.Errorf("%v allocations per recompute", n)
	}
}

func benchAdmission(b *testing.B) (*Admission, *VirtualServer) {
	cfg := limitsCfg{
		web:  Limits{MaxConnections: 1 << 40, EnforceConnections: true, MaxBandwidth: 1 << 40, EnforceBandwidth: true},
		gold: Limits{MaxConnections: 1 << 40, EnforceConnections: true},
		all:  Limits{MaxConnections: 1 << 40, EnforceConnections: true},
		inst: Limits{MaxConnections: 1 << 40, EnforceConnections: true, MaxBandwidth: 1 << 40, EnforceBandwidth: true, BurstBytes: 1 << 30},
	}.build(b)
	return NewAdmission(cfg, 0), cfg.ServiceByName("web")
}

// BenchmarkAdmit measures one admit and release through four enforced levels
// (virtual server, class, parent class, instance).
func BenchmarkAdmit(b *testing.B) {
	b.Run("serial", func(b *testing.B) {
		a, web := benchAdmission(b)
		var tk Ticket
		b.ReportAllocs()
		for b.Loop() {
			if _, ok := a.Admit(web, &tk); !ok {
				b.Fatal("refused")
			}
			tk.Release()
		}
	})
	b.Run("parallel", func(b *testing.B) {
		a, web := benchAdmission(b)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			var tk Ticket
			for pb.Next() {
				if _, ok := a.Admit(web, &tk); !ok {
					b.Error("refused")
					return
				}
				tk.Release()
			}
		})
	})
}

// TestAdmitConcurrentReload admits and releases from many goroutines, with
// VirtualServer pointers from either config, while the control plane swaps
// the configs and recomputes: no enforced limit is ever exceeded beyond the
// larger of the two, and every count returns to zero.
func TestAdmitConcurrentReload(t *testing.T) {
	enf := func(n int64) Limits { return Limits{MaxConnections: n, EnforceConnections: true} }
	cfgs := []*Config{
		limitsCfg{web: enf(3), gold: enf(6), inst: enf(9)}.build(t),
		limitsCfg{web: enf(5), gold: enf(4), inst: enf(7)}.build(t),
	}
	a := NewAdmission(cfgs[0], 0)
	src := &testBytes{}
	var stop atomic.Bool
	var bad atomic.Value
	var ctl sync.WaitGroup
	ctl.Add(1)
	go func() {
		defer ctl.Done()
		t0 := time.Unix(0, 0)
		for i := 0; !stop.Load(); i++ {
			a.Apply(cfgs[i%2])
			a.Recompute(t0.Add(time.Duration(i)*100*time.Millisecond), src)
			for _, s := range a.Snapshot() {
				if lim := map[string]int64{"web": 5, "gold": 6, "weir": 9}[s.Name]; lim > 0 && s.Conns > lim {
					bad.Store(s.Name)
				}
			}
			runtime.Gosched()
		}
	}()
	var workers sync.WaitGroup
	for g := 0; g < 12; g++ {
		workers.Add(1)
		go func(g int) {
			defer workers.Done()
			var held [2]Ticket
			for i := 0; i < 2000; i++ {
				cfg := cfgs[(g+i)%2]
				vs := cfg.Services[(g+i/2)%len(cfg.Services)]
				tk := &held[i%2]
				a.Admit(vs, tk) // releases what tk held first
				src.add(vs.Name, 10)
				runtime.Gosched()
			}
			held[0].Release()
			held[1].Release()
		}(g)
	}
	workers.Wait()
	stop.Store(true)
	ctl.Wait()
	a.Recompute(time.Unix(1<<20, 0), src) // feed the bytes counted since the last step
	if v := bad.Load(); v != nil {
		t.Fatalf("%s exceeded the larger of its limits", v)
	}
	for _, s := range a.Snapshot() {
		if s.Conns != 0 {
			t.Errorf("%v %q: %d connections left", s.Level, s.Name, s.Conns)
		}
	}
	if s := stat(t, a, LevelInstance, "weir"); s.Bytes == 0 || s.Bytes%10 != 0 {
		t.Errorf("instance bytes %d", s.Bytes)
	}
}

func TestInstanceRenameKeepsStatistics(t *testing.T) {
	cfg := limitsCfg{}.build(t)
	a := NewAdmission(cfg, 0)
	var tk Ticket
	a.Admit(cfg.ServiceByName("misc"), &tk)
	renamed := limitsCfg{inst: Limits{MaxConnections: 1, EnforceConnections: true}}.build(t)
	renamed.Instance.Name = "edge"
	a.Apply(renamed)
	r, ok := a.Admit(renamed.ServiceByName("misc"), &Ticket{})
	if want := (Refusal{LevelInstance, "edge", LimitMaxConnections, 1, 1, false, 0}); ok || r != want {
		t.Errorf("ok=%v %v, want %v", ok, r, want)
	}
	tk.Release()
	if s := stat(t, a, LevelInstance, "edge"); s.Conns != 0 {
		t.Errorf("instance after release: %+v", s)
	}
}

func TestReloadResizesBurst(t *testing.T) {
	withBurst := func(burst int64) *Config {
		return limitsCfg{web: Limits{MaxBandwidth: 1000, EnforceBandwidth: true, BurstBytes: burst}}.build(t)
	}
	cfg := withBurst(5000)
	a := NewAdmission(cfg, 0)
	src := &testBytes{}
	tokens := func() int64 { return stat(t, a, LevelVirtualServer, "web").BurstTokens }
	if got := tokens(); got != 5000 {
		t.Fatalf("new bucket holds %d, want full (5000)", got)
	}
	a.Apply(withBurst(1000))
	if got := tokens(); got != 1000 {
		t.Errorf("after shrinking to 1000: %d", got)
	}
	var tk Ticket
	a.Admit(cfg.ServiceByName("web"), &tk)
	t0 := time.Unix(0, 0)
	a.Recompute(t0, src)
	src.add("web", 10000)
	a.Recompute(t0.Add(100*time.Millisecond), src)
	if got := tokens(); got != -1000 {
		t.Fatalf("debt %d, want the floor -1000", got)
	}
	a.Apply(withBurst(400))
	if got := tokens(); got != -400 {
		t.Errorf("after shrinking to 400 the debt is %d, want -400", got)
	}
	drain(a)
	a.Apply(withBurst(0)) // guard off: the next recompute reports it cleared
	a.Recompute(t0.Add(200*time.Millisecond), src)
	var burst []Event
	for _, e := range drain(a) {
		if e.Limit == LimitBurst {
			burst = append(burst, e)
		}
	}
	if len(burst) != 1 || burst[0].Over {
		t.Errorf("burst events after turning the guard off: %v, want one under", burst)
	}
	if _, ok := a.Admit(cfg.ServiceByName("web"), &tk); !ok {
		t.Error("refused with the guard off and the window under its limit")
	}
}

func TestApplyUnlistedClassLoop(t *testing.T) {
	a := &Class{Name: "a"}
	b := &Class{Name: "b", Parent: a, Limits: Limits{MaxConnections: 1, EnforceConnections: true}}
	a.Parent = b // a loop through classes the config does not list
	cfg := limitsCfg{}.build(t)
	web := cfg.ServiceByName("web")
	web.Class = a
	adm := NewAdmission(cfg, 0)
	var tk Ticket
	if _, ok := adm.Admit(web, &tk); !ok {
		t.Fatal("first connection refused")
	}
	if r, ok := adm.Admit(web, &Ticket{}); ok || r.Name != "b" {
		t.Fatalf("ok=%v %v, want class b's limit", ok, r)
	}
	tk.Release()
	for _, s := range adm.Snapshot() {
		if s.Conns != 0 {
			t.Errorf("%v %q: %d connections", s.Level, s.Name, s.Conns)
		}
	}
}

// TestBytesBeforeFirstRecompute: traffic metered before the first Recompute
// is in the window (it used to become the window's starting point).
func TestBytesBeforeFirstRecompute(t *testing.T) {
	vs := &VirtualServer{Name: "web", VIPs: []netip.Addr{netip.MustParseAddr("198.18.0.10")}, Ports: PortRange{Lo: 80, Hi: 80}}
	cfg, err := Compile(&Config{Services: []*VirtualServer{vs}, Instance: Instance{MetricInterval: time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	a := NewAdmission(cfg, 0)
	src := &testBytes{}
	src.add("web", 200000)
	now := time.Unix(100, 0)
	a.Recompute(now, src)
	a.Recompute(now.Add(100*time.Millisecond), src)
	for _, l := range a.Snapshot() {
		if l.Bandwidth != 200000 {
			t.Errorf("%v %s: bandwidth %d, want 200000", l.Level, l.Name, l.Bandwidth)
		}
	}
}

// classMoveCfg builds web in class a or b (both under the instance).
func classMoveCfg(t testing.TB, in string) *Config {
	t.Helper()
	a, b := &Class{Name: "a"}, &Class{Name: "b"}
	cl := a
	if in == "b" {
		cl = b
	}
	c, err := Compile(&Config{
		Classes: []*Class{a, b},
		Services: []*VirtualServer{{Name: "web", Class: cl, Ports: PortRange{80, 80},
			VIPs: []netip.Addr{netip.MustParseAddr("10.0.0.1")}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestReloadMovesClass: a virtual server moved to another class in a reload
// takes its open connections along: they count on the new class at once
// (before, they stayed on the old one until they closed), and release from
// it.
func TestReloadMovesClass(t *testing.T) {
	cfgA := classMoveCfg(t, "a")
	adm := NewAdmission(cfgA, 0)
	tickets := make([]Ticket, 3)
	for i := range tickets {
		if _, ok := adm.Admit(cfgA.Services[0], &tickets[i]); !ok {
			t.Fatal("refused")
		}
	}
	cfgB := classMoveCfg(t, "b")
	adm.Apply(cfgB)
	if a, b := stat(t, adm, LevelClass, "a").Conns, stat(t, adm, LevelClass, "b").Conns; a != 0 || b != 3 {
		t.Fatalf("after the move: class a %d, b %d; want 0 and 3", a, b)
	}
	tickets[0].Release()
	// A connection admitted under the old config's virtual server, after
	// the reload, counts on the new class too.
	var late Ticket
	adm.Admit(cfgA.Services[0], &late)
	adm.Apply(classMoveCfg(t, "a")) // and back
	if a, b := stat(t, adm, LevelClass, "a").Conns, stat(t, adm, LevelClass, "b").Conns; a != 3 || b != 0 {
		t.Fatalf("moved back: class a %d, b %d; want 3 and 0", a, b)
	}
	late.Release()
	for i := range tickets {
		tickets[i].Release()
	}
	for _, s := range adm.Snapshot() {
		if s.Conns != 0 {
			t.Errorf("%v %s: %d open after every release", s.Level, s.Name, s.Conns)
		}
	}
}

// TestReloadMovesClassConcurrent: admits and releases race with reloads
// that move the virtual server between classes; once everything is
// released, every level reads 0, and while connections are open the two
// classes together hold exactly the instance's count.
func TestReloadMovesClassConcurrent(t *testing.T) {
	cfgs := []*Config{classMoveCfg(t, "a"), classMoveCfg(t, "b")}
	adm := NewAdmission(cfgs[0], 0)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var tk [8]Ticket
			for i := 0; ; i++ {
				select {
				case <-stop:
					for j := range tk {
						tk[j].Release()
					}
					return
				default:
				}
				j := (i + g) % len(tk)
				if tk[j].Admitted() {
					tk[j].Release()
				} else {
					adm.Admit(cfgs[i%2].Services[0], &tk[j])
				}
			}
		}()
	}
	for i := range 50 {
		adm.Apply(cfgs[i%2])
		runtime.Gosched()
	}
	close(stop)
	wg.Wait()
	for _, s := range adm.Snapshot() {
		if s.Conns != 0 {
			t.Errorf("%v %s: %d open after every release", s.Level, s.Name, s.Conns)
		}
	}
}
