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
			want := Refusal{Over: Over{LevelVirtualServer, "web", LimitMaxBandwidth, 100, 166, false, 0, false, 0}}
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
	if got := (Refusal{Over: Over{LevelVirtualServer, "web", LimitMaxBandwidth, 100, 166, false, 0, false, 0}}).Error(); got != want {
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
			Refusal{Over: Over{LevelVirtualServer, "web", LimitMaxConnections, 2, 2, false, 0, false, 0}}},
		{"class sums its virtual servers", limitsCfg{web: enfConns(5), gold: enfConns(3)}, []string{"web", "api", "api"}, "api",
			Refusal{Over: Over{LevelClass, "gold", LimitMaxConnections, 3, 3, false, 0, false, 0}}},
		{"parent class", limitsCfg{gold: enfConns(9), all: enfConns(2)}, []string{"api", "web"}, "web",
			Refusal{Over: Over{LevelClass, "all", LimitMaxConnections, 2, 2, false, 0, false, 0}}},
		{"instance counts classless services", limitsCfg{inst: enfConns(3)}, []string{"misc", "web", "api"}, "misc",
			Refusal{Over: Over{LevelInstance, "weir", LimitMaxConnections, 3, 3, false, 0, false, 0}}},
		{"the tighter lower level trips first", limitsCfg{web: enfConns(1), inst: enfConns(1)}, []string{"web"}, "web",
			Refusal{Over: Over{LevelVirtualServer, "web", LimitMaxConnections, 1, 1, false, 0, false, 0}}},
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
	if want := (Refusal{Over: Over{LevelClass, "gold", LimitMaxBandwidth, 100, 150, false, 0, false, 0}}); ok || r != want {
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
	// web sets its own maxConnections, which overrides gold's and the
	// instance's for web's connections: gold and the instance still count
	// them, so each holds at most its own limit (what its other members may
	// fill) plus web's.
	bound := map[string]int64{"web": webMax, "gold": goldMax + webMax, "weir": instMax + webMax}
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
				if lim := bound[s.Name]; lim > 0 {
					check(s.Name+" snapshot", s.Conns, lim)
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
					check("gold", inGold.Add(1), bound["gold"])
				}
				check("instance", inInst.Add(1), bound["weir"])
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

func TestAdmitUnknownService(t *testing.T) {
	cfg := limitsCfg{inst: Limits{MaxConnections: 1, EnforceConnections: true}}.build(t)
	a := NewAdmission(cfg, 0)
	var tk Ticket
	if _, ok := a.Admit(&VirtualServer{Name: "nowhere"}, &tk); !ok {
		t.Fatal("unknown service refused below the instance limit")
	}
	r, ok := a.Admit(nil, &Ticket{})
	if want := (Refusal{Over: Over{LevelInstance, "weir", LimitMaxConnections, 1, 1, false, 0, false, 0}}); ok || r != want {
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
		LevelKind(9).String(): "LevelKind(9)", LimitMaxConnections.String(): "maxConnections",
		LimitMaxBandwidth.String(): "maxBandwidth", LimitBurst.String(): "burst", LimitKind(7).String(): "LimitKind(7)",
		(Refusal{Over: Over{LevelClass, "gold", LimitMaxConnections, 100, 100, false, 0, false, 0}}).String():                               `class "gold": maxConnections 100 reached (100 open)`,
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
