package policy

import (
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

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
	if want := (Refusal{Over: Over{LevelVirtualServer, "web", LimitMaxConnections, 3, 3, false, 0, false, 0}}); ok || r != want {
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
				// web's own limit overrides gold's and the instance's for
				// web's connections, which they still count.
				if lim := map[string]int64{"web": 5, "gold": 6 + 5, "weir": 9 + 5}[s.Name]; lim > 0 && s.Conns > lim {
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
	if want := (Refusal{Over: Over{LevelInstance, "edge", LimitMaxConnections, 1, 1, false, 0, false, 0}}); ok || r != want {
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
