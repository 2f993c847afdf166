package policy

import (
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestCompileCluster(t *testing.T) {
	c, err := Compile(&Config{Hostname: "box7", Cluster: &Cluster{Redis: "r:1", Name: "e"}})
	if err != nil {
		t.Fatal(err)
	}
	if got := *c.Cluster; got != (Cluster{Redis: "r:1", Name: "e", Instance: "box7", LeaseInterval: DefaultLeaseInterval, BorrowTimeout: DefaultBorrowTimeout}) {
		t.Errorf("defaults: %+v", got)
	}
	if c, err := Compile(&Config{}); err != nil || c.Cluster != nil {
		t.Errorf("no cluster section: %v, %+v", err, c.Cluster)
	}

	for _, tt := range []struct {
		cl   Cluster
		want string
	}{
		{Cluster{Name: "e", Instance: "i"}, "redis (an address or URL) is required"},
		{Cluster{Redis: "r:1", Instance: "i"}, "name is required"},
		{Cluster{Redis: "r:1", Name: "e"}, "instance not set and the host name is unknown"},
		{Cluster{Redis: "r:1", Name: "e{", Instance: "i"}, "may not contain { or }"},
		{Cluster{Redis: "r:1", Name: "e", Instance: "i", LeaseInterval: time.Millisecond}, "leaseInterval 1ms is below 10ms"},
		{Cluster{Redis: "r:1", Name: "e", Instance: "i", OnRedisDown: 9}, "unknown onRedisDown RedisDown(9)"},
	} {
		cl := tt.cl
		_, err := Compile(&Config{Cluster: &cl})
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%+v: error %v, want %q", tt.cl, err, tt.want)
		}
	}
}

func TestParseRedisDown(t *testing.T) {
	for d := LocalShare; d <= FailClosed; d++ {
		if got, err := ParseRedisDown(d.String()); err != nil || got != d {
			t.Errorf("%v: %v %v", d, got, err)
		}
	}
	if _, err := ParseRedisDown("localshare"); err == nil {
		t.Error("case-insensitive parse accepted")
	}
}

func shareCfg(t *testing.T, max int64) *Config {
	t.Helper()
	c, err := Compile(&Config{Services: []*VirtualServer{{
		Name: "web", VIPs: []netip.Addr{netip.MustParseAddr("198.18.0.1")}, Ports: PortRange{80, 80},
		Limits:  Limits{MaxConnections: max, EnforceConnections: true},
		Targets: []*Target{{Addr: netip.MustParseAddrPort("198.18.1.1:80"), Weight: 1}},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestSetCapacity checks that a share below the limit refuses with a
// Shared refusal and counts the shortfall, that the limit still refuses
// above the share, and that a negative share removes it.
func TestSetCapacity(t *testing.T) {
	cfg := shareCfg(t, 5)
	a := NewAdmission(cfg, 0)
	web := cfg.ServiceByName("web")
	a.SetDefaultCapacity(0)
	var t0 Ticket
	r, ok := a.Admit(web, &t0)
	if want := (Refusal{Over: Over{LevelVirtualServer, "web", LimitMaxConnections, 5, 0, true, 0, false, 0}}); ok || r != want {
		t.Fatalf("no slots held: %v %v, want %v", ok, r, want)
	}
	if want := `virtual server "web": maxConnections 5 reached (0 open here, this instance's share of the cluster-wide limit is 0)`; r.Error() != want {
		t.Errorf("text %q\nwant %q", r.Error(), want)
	}
	if open, ok := a.SetCapacity(LevelVirtualServer, "web", 2); !ok || open != 0 {
		t.Fatalf("SetCapacity: %d %v", open, ok)
	}
	tk := make([]Ticket, 6)
	for i := range 2 {
		if r, ok := a.Admit(web, &tk[i]); !ok {
			t.Fatalf("admit %d under share 2: %v", i, r)
		}
	}
	if r, ok := a.Admit(web, &tk[2]); ok || !r.Shared || r.Share != 2 || r.Measured != 2 {
		t.Fatalf("third under share 2: %v %+v", ok, r)
	}
	s := stat(t, a, LevelVirtualServer, "web")
	if s.Capacity != 2 || s.ShareRefused != 2 || s.Conns != 2 {
		t.Errorf("stat %+v", s)
	}
	// The share never lifts the limit.
	a.SetCapacity(LevelVirtualServer, "web", 100)
	for i := 2; i < 5; i++ {
		if r, ok := a.Admit(web, &tk[i]); !ok {
			t.Fatalf("admit %d under share 100: %v", i, r)
		}
	}
	if r, ok := a.Admit(web, &tk[5]); ok || r.Shared {
		t.Fatalf("sixth at limit 5: %v %+v, want the limit's refusal", ok, r)
	}
	// Shrinking below the open count reports them and refuses new ones.
	if open, _ := a.SetCapacity(LevelVirtualServer, "web", 1); open != 5 {
		t.Errorf("open after shrink %d, want 5", open)
	}
	tk[4].Release()
	if _, ok := a.Admit(web, &tk[4]); ok {
		t.Error("admitted with 4 open over a share of 1")
	}
	a.SetCapacity(LevelVirtualServer, "web", -1)
	if s := stat(t, a, LevelVirtualServer, "web"); s.Capacity != -1 {
		t.Errorf("capacity after removal %d", s.Capacity)
	}
	if _, ok := a.Admit(web, &tk[4]); !ok {
		t.Error("refused below the limit without a share")
	}
	if _, ok := a.SetCapacity(LevelClass, "nope", 1); ok {
		t.Error("SetCapacity found a level the config lacks")
	}
	// The instance level is found by kind, and a level a reload creates
	// gets the default share.
	if _, ok := a.SetCapacity(LevelInstance, "whatever", 3); !ok {
		t.Error("instance level not found by kind")
	}
	for i := range tk {
		tk[i].Release()
	}
}

// TestSetCapacityShrinkRace pins the bound SetCapacity promises: while
// goroutines admit and release as fast as they can, after each shrink to c
// that returned open, the level never holds more than max(c, open).
func TestSetCapacityShrinkRace(t *testing.T) {
	cfg := shareCfg(t, 1000)
	a := NewAdmission(cfg, 0)
	web := cfg.ServiceByName("web")
	a.SetCapacity(LevelVirtualServer, "web", 1000)
	var bound, over atomic.Int64
	bound.Store(1000)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
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
				j := i % len(tk)
				tk[j].Release()
				a.Admit(web, &tk[j])
				b := bound.Load() // before the count: a bound stored after its shrink
				if n := stat(t, a, LevelVirtualServer, "web").Conns; n > b {
					over.Store(n)
				}
			}
		}()
	}
	for c := int64(32); c >= 0; c-- {
		bound.Store(1000)
		open, _ := a.SetCapacity(LevelVirtualServer, "web", c)
		bound.Store(max(c, open))
		time.Sleep(2 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	if n := over.Load(); n != 0 {
		t.Errorf("level held %d connections, above max(share, open after the shrink)", n)
	}
	if n := stat(t, a, LevelVirtualServer, "web").Conns; n != 0 {
		t.Errorf("%d connections left open", n)
	}
}

// BenchmarkAdmitShared is BenchmarkAdmit's serial case with a cluster share
// set at every level (what the cluster package does): the cost of the
// share on the admission path, against BenchmarkAdmit/serial without.
func BenchmarkAdmitShared(b *testing.B) {
	a, web := benchAdmission(b)
	a.SetDefaultCapacity(1 << 30)
	var tk Ticket
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := a.Admit(web, &tk); !ok {
			b.Fatal("refused")
		}
		tk.Release()
	}
}

func TestAdmitSharedAllocs(t *testing.T) {
	cfg := shareCfg(t, 5)
	a := NewAdmission(cfg, 0)
	a.SetDefaultCapacity(1)
	web := cfg.ServiceByName("web")
	var tk, other Ticket
	if n := testing.AllocsPerRun(100, func() {
		a.Admit(web, &tk)
		a.Admit(web, &other) // refused by the share
		tk.Release()
	}); n != 0 {
		t.Errorf("%v allocations per admit under a share", n)
	}
}

// TestSetRemoteBandwidth: a level whose maxBandwidth is shared is judged
// on its own window rate plus the others': Sun's example (5000 bytes at
// t=1 s, window 30 s → 166 B/s) over a limit of 200 B/s is admitted alone
// and refused once the others add 100 B/s; the figures are shown apart,
// and the crossing is logged on the sum.
func TestSetRemoteBandwidth(t *testing.T) {
	c, err := Compile(&Config{
		Instance: Instance{MetricInterval: 30 * time.Second, RecomputeInterval: 100 * time.Millisecond},
		Services: []*VirtualServer{{
			Name: "web", VIPs: []netip.Addr{netip.MustParseAddr("198.18.0.1")}, Ports: PortRange{80, 80},
			Limits:  Limits{MaxBandwidth: 200, EnforceBandwidth: true},
			Targets: []*Target{{Addr: netip.MustParseAddrPort("198.18.1.1:80"), Weight: 1}},
		}}})
	if err != nil {
		t.Fatal(err)
	}
	a := NewAdmission(c, 16)
	var b testBytes
	t0 := time.Unix(1000, 0)
	a.Recompute(t0, &b)
	b.add("web", 5000)
	a.Recompute(t0.Add(time.Second), &b)
	vs := c.ServiceByName("web")
	var tk Ticket
	if r, ok := a.Admit(vs, &tk); !ok {
		t.Fatalf("refused alone at 166 B/s: %v", r)
	}
	tk.Release()
	if !a.SetRemoteBandwidth(LevelVirtualServer, "web", 100) || a.SetRemoteBandwidth(LevelVirtualServer, "nope", 1) {
		t.Fatal("SetRemoteBandwidth: wrong ok")
	}
	a.Recompute(t0.Add(1100*time.Millisecond), &b)
	r, ok := a.Admit(vs, &tk)
	if ok || r.Limit != LimitMaxBandwidth || r.Measured != 266 {
		t.Errorf("with 100 B/s elsewhere: %v %v, want refused at 266 B/s", ok, r)
	}
	if s := stat(t, a, LevelVirtualServer, "web"); s.Bandwidth != 266 || s.LocalBandwidth != 166 || s.RemoteBandwidth != 100 {
		t.Errorf("figures %+v", s)
	}
	ev := <-a.Events()
	if !ev.Over || ev.Measured != 266 {
		t.Errorf("event %+v", ev)
	}
	a.SetRemoteBandwidth(LevelVirtualServer, "web", -5)
	a.Recompute(t0.Add(1200*time.Millisecond), &b)
	if _, ok := a.Admit(vs, &tk); !ok {
		t.Error("refused after the others' bandwidth went")
	}
	tk.Release()
}

// TestSetRemoteConns: a logged maxConnections counts the other instances'
// connections in its crossing events (the log line), an enforced one does
// not (its leases make it exact).
func TestSetRemoteConns(t *testing.T) {
	c, err := Compile(&Config{Services: []*VirtualServer{{
		Name: "web", VIPs: []netip.Addr{netip.MustParseAddr("198.18.0.1")}, Ports: PortRange{80, 80},
		Limits:  Limits{MaxConnections: 3},
		Targets: []*Target{{Addr: netip.MustParseAddrPort("198.18.1.1:80"), Weight: 1}},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	a := NewAdmission(c, 16)
	vs := c.ServiceByName("web")
	var t1, t2 Ticket
	a.Admit(vs, &t1)
	if !a.SetRemoteConns(LevelVirtualServer, "web", 2) || a.SetRemoteConns(LevelClass, "nope", 1) {
		t.Fatal("SetRemoteConns: wrong ok")
	}
	if _, ok := a.Admit(vs, &t2); !ok {
		t.Fatal("a logged limit refused")
	}
	select {
	case e := <-a.Events():
		if !e.Over || e.Measured != 4 || e.Enforced {
			t.Errorf("event %+v, want over at 2 here + 2 elsewhere", e)
		}
	default:
		t.Fatal("no event when the cluster's 4 crossed the logged 3")
	}
	if s := stat(t, a, LevelVirtualServer, "web"); s.RemoteConns != 2 || s.Conns != 2 {
		t.Errorf("figures %+v", s)
	}
	t2.Release()
	a.SetRemoteConns(LevelVirtualServer, "web", 0)
	a.Recompute(time.Unix(1, 0), nil)
	if e := <-a.Events(); e.Over || e.Measured != 1 {
		t.Errorf("back under: %+v", e)
	}
	t1.Release()
}

// TestSetShareDeadline: past the deadline every share admits as if it
// were 0 (a Shared refusal), a level without a share is unaffected, and a
// later deadline, or none, restores the shares.
func TestSetShareDeadline(t *testing.T) {
	cfg := shareCfg(t, 5)
	a := NewAdmission(cfg, 0)
	web := cfg.ServiceByName("web")
	a.SetCapacity(LevelVirtualServer, "web", 3)
	var t0, t1 Ticket
	a.SetShareDeadline(time.Now().Add(time.Hour))
	if r, ok := a.Admit(web, &t0); !ok {
		t.Fatalf("before the deadline: %v", r)
	}
	a.SetShareDeadline(time.Now().Add(-time.Millisecond))
	if r, ok := a.Admit(web, &t1); ok || !r.Shared || r.Share != 0 {
		t.Fatalf("past the deadline: %v %+v", ok, r)
	}
	a.SetCapacity(LevelVirtualServer, "web", -1)
	if r, ok := a.Admit(web, &t1); !ok {
		t.Fatalf("no share, past the deadline: %v", r)
	}
	t1.Release()
	a.SetCapacity(LevelVirtualServer, "web", 3)
	a.SetShareDeadline(time.Time{})
	if r, ok := a.Admit(web, &t1); !ok {
		t.Fatalf("deadline removed: %v", r)
	}
	t0.Release()
	t1.Release()
}
