package policy

import (
	"net/netip"
	"runtime"
	"slices"
	"testing"
	"time"
)

func clientCfg(t testing.TB, inst, web ClientLimits) (*Config, *VirtualServer) {
	t.Helper()
	vs := &VirtualServer{Name: "web", Ports: PortRange{80, 80}, VIPs: []netip.Addr{netip.MustParseAddr("10.0.0.1")}, ClientLimits: web}
	c, err := Compile(&Config{Instance: Instance{ClientLimits: inst}, Services: []*VirtualServer{vs}})
	if err != nil {
		t.Fatal(err)
	}
	return c, vs
}

// TestClientMaxConnections: client A's third connection is refused at
// maxConnections 2, naming the client, while client B is admitted; a
// release frees A's slot; a /24 groups two addresses into one client.
func TestClientMaxConnections(t *testing.T) {
	cfg, vs := clientCfg(t, ClientLimits{}, ClientLimits{Limits: Limits{MaxConnections: 2, EnforceConnections: true}})
	a := NewAdmission(cfg, 0)
	ca, cb := netip.MustParseAddr("198.18.5.1"), netip.MustParseAddr("198.18.5.2")
	var ta [3]Ticket
	var tb Ticket
	for i := 0; i < 2; i++ {
		if _, ok := a.AdmitClient(vs, ca, &ta[i]); !ok {
			t.Fatalf("A's connection %d refused", i)
		}
	}
	r, ok := a.AdmitClient(vs, ca, &ta[2])
	if want := "client 198.18.5.1: maxConnections 2 reached (2 open)"; ok || r.Error() != want {
		t.Fatalf("A's third: ok=%v %q, want %q", ok, r.Error(), want)
	}
	if _, ok := a.AdmitClient(vs, cb, &tb); !ok {
		t.Fatal("client B refused")
	}
	if st := a.Snapshot()[1]; st.Conns != 3 {
		t.Fatalf("virtual server counts %d, want 3 (A's two, B's one; the refused one not)", st.Conns)
	}
	ta[0].Release()
	if _, ok := a.AdmitClient(vs, ca, &ta[2]); !ok {
		t.Fatal("A refused after one of its connections closed")
	}
	// IPv4-mapped IPv6 is the same client.
	if _, ok := a.AdmitClient(vs, netip.MustParseAddr("::ffff:198.18.5.1"), &ta[0]); ok {
		t.Fatal("::ffff:198.18.5.1 admitted as a third connection of 198.18.5.1")
	}
	for i := range ta {
		ta[i].Release()
	}
	tb.Release()

	// Grouped by /24 at the instance: A and B are one client there.
	cfg, vs = clientCfg(t, ClientLimits{Limits: Limits{MaxConnections: 1, EnforceConnections: true}, PrefixV4: 24}, ClientLimits{})
	a.Apply(cfg)
	if _, ok := a.AdmitClient(vs, ca, &ta[0]); !ok {
		t.Fatal("A refused")
	}
	r, ok = a.AdmitClient(vs, cb, &tb)
	if want := "client 198.18.5.0/24: maxConnections 1 reached (1 open)"; ok || r.Error() != want {
		t.Fatalf("B in A's /24: ok=%v %q, want %q", ok, r.Error(), want)
	}
	if _, ok := a.AdmitClient(vs, netip.MustParseAddr("198.18.6.1"), &tb); !ok {
		t.Fatal("a client of another /24 refused")
	}
	ta[0].Release()
	tb.Release()
}

// TestClientLoggedLimit: a limit that is not enforced admits and reports
// the client's excess once, as an event naming the client.
func TestClientLoggedLimit(t *testing.T) {
	cfg, vs := clientCfg(t, ClientLimits{}, ClientLimits{Limits: Limits{MaxConnections: 1}})
	a := NewAdmission(cfg, 0)
	c := netip.MustParseAddr("2001:db8::7")
	var tk [3]Ticket
	for i := range tk {
		if _, ok := a.AdmitClient(vs, c, &tk[i]); !ok {
			t.Fatalf("connection %d refused by a logged limit", i)
		}
	}
	select {
	case e := <-a.Events():
		if want := "client 2001:db8::7: maxConnections 1 reached (2 open), not enforced"; e.String() != want {
			t.Fatalf("event %q, want %q", e.String(), want)
		}
	default:
		t.Fatal("no event for the client's excess")
	}
	select {
	case e := <-a.Events():
		t.Fatalf("a second event for the same excess: %v", e)
	default:
	}
	for i := range tk {
		tk[i].Release()
	}
}

// TestClientBandwidth: per-client bandwidth with Sun's window semantics:
// with a 30 s window, 5000 bytes a client moved at 1 s read 166 B/s from
// then until the sample is older than the window; over an enforced 100
// B/s the client's new connections are refused, another client's are not.
func TestClientBandwidth(t *testing.T) {
	cfg, vs := clientCfg(t, ClientLimits{}, ClientLimits{Limits: Limits{MaxBandwidth: 100, EnforceBandwidth: true}})
	a := NewAdmission(cfg, 0)
	t0 := time.Unix(0, 0).Add(time.Hour)
	a.Recompute(t0, nil)
	ca, cb := netip.MustParseAddr("198.18.5.1"), netip.MustParseAddr("198.18.5.2")
	var tk, tb Ticket
	if _, ok := a.AdmitClient(vs, ca, &tk); !ok {
		t.Fatal("refused at 0 B/s")
	}
	a.Recompute(t0.Add(time.Second), nil)
	tk.AddClientBytes(5000)
	tk.Release()
	a.Recompute(t0.Add(1100*time.Millisecond), nil)
	r, ok := a.AdmitClient(vs, ca, &tk)
	if want := "client 198.18.5.1: maxBandwidth 100 B/s exceeded (measured 166 B/s)"; ok || r.Error() != want {
		t.Fatalf("at 166 B/s: ok=%v %q, want %q", ok, r.Error(), want)
	}
	if _, ok := a.AdmitClient(vs, cb, &tb); !ok {
		t.Fatal("client B refused for A's bandwidth")
	}
	tb.Release()
	a.Recompute(t0.Add(30*time.Second), nil)
	if _, ok := a.AdmitClient(vs, ca, &tk); ok {
		t.Fatal("admitted at 30 s: the 1 s sample is still in the window")
	}
	a.Recompute(t0.Add(32*time.Second), nil)
	if r, ok := a.AdmitClient(vs, ca, &tk); !ok {
		t.Fatalf("refused at 32 s, the sample out of the window: %v", r.Error())
	}
	tk.Release()
}

// TestClientTableBound: at tableSize the least recently used idle client
// makes room; with every entry busy a new client is admitted without a
// client limit and counted as overflow.
func TestClientTableBound(t *testing.T) {
	cfg, vs := clientCfg(t, ClientLimits{}, ClientLimits{Limits: Limits{MaxConnections: 1, EnforceConnections: true}, TableSize: 3})
	a := NewAdmission(cfg, 0)
	addr := func(i int) netip.Addr { return netip.AddrFrom4([4]byte{198, 18, 9, byte(i)}) }
	var tk [6]Ticket
	for i := 0; i < 3; i++ {
		if _, ok := a.AdmitClient(vs, addr(i), &tk[i]); !ok {
			t.Fatal(i)
		}
	}
	// Full of busy clients: the fourth is admitted, overflow counted.
	if _, ok := a.AdmitClient(vs, addr(3), &tk[3]); !ok {
		t.Fatal("overflow refused")
	}
	if cs := a.Clients()[0]; cs.Overflow != 1 || cs.Clients != 3 || cs.Active != 3 {
		t.Fatalf("%+v, want 3 clients, 3 active, 1 overflow", cs)
	}
	tk[3].Release()
	tk[1].Release() // 1 idle: the least recently used
	tk[0].Release() // 0 idle, more recent
	if _, ok := a.AdmitClient(vs, addr(4), &tk[4]); !ok {
		t.Fatal(4)
	}
	cs := a.Clients()[0]
	if cs.Evicted != 1 || cs.Clients != 3 || cs.Active != 2 {
		t.Fatalf("%+v, want one eviction, 3 clients, 2 active", cs)
	}
	// 0 is still there: its second connection is refused; 1 was evicted.
	var x Ticket
	if _, ok := a.AdmitClient(vs, addr(0), &tk[0]); !ok {
		t.Fatal("0 refused with no connection open")
	}
	if _, ok := a.AdmitClient(vs, addr(0), &x); ok {
		t.Fatal("0's second connection admitted")
	}
	for i := range tk {
		tk[i].Release()
	}
	if cs := a.Clients()[0]; cs.Active != 0 {
		t.Fatalf("%d active after every release", cs.Active)
	}
}

// clientEntryBytes fills a table with n distinct clients (each admitted
// and released: idle entries, the table's steady state) and returns the
// heap bytes per entry, map included.
func clientEntryBytes(t testing.TB, n int, bandwidth bool) float64 {
	cl := ClientLimits{Limits: Limits{MaxConnections: 4, EnforceConnections: true}, TableSize: n}
	if bandwidth {
		cl.MaxBandwidth, cl.EnforceBandwidth = 1e6, true
	}
	cfg, vs := clientCfg(t, ClientLimits{}, cl)
	a := NewAdmission(cfg, 0)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	var tk Ticket
	for i := 0; i < n; i++ {
		c := netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})
		if _, ok := a.AdmitClient(vs, c, &tk); !ok {
			t.Fatalf("client %d refused", i)
		}
		if bandwidth {
			tk.AddClientBytes(1500)
		}
		tk.Release()
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	cs := a.Clients()[0]
	if cs.Clients != n || cs.Active != 0 || cs.Overflow != 0 {
		t.Fatalf("%+v, want %d idle clients", cs, n)
	}
	runtime.KeepAlive(a)
	return float64(after.HeapAlloc-before.HeapAlloc) / float64(n)
}

// TestClientTableMemory: 100 000 distinct client addresses in one table,
// bounded in time; it reports the bytes per entry and fails above 400
// (the entry is 72 bytes, the map's slot and overhead the rest).
func TestClientTableMemory(t *testing.T) {
	start := time.Now()
	per := clientEntryBytes(t, 100_000, false)
	withBW := clientEntryBytes(t, 100_000, true)
	t.Logf("100000 clients: %.0f B per entry, %.0f B with maxBandwidth (its window), in %v", per, withBW, time.Since(start))
	if per > 400 || withBW > 400+int64Size*ClientSlots {
		t.Fatalf("%.0f / %.0f bytes per client entry", per, withBW)
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Fatalf("100000 clients took %v", d)
	}
}

const int64Size = 8

// BenchmarkClientTableMillion measures the bytes per entry at 1 M clients
// (reported as B/entry) and the admission cost per new client.
func BenchmarkClientTableMillion(b *testing.B) {
	for i := 0; i < b.N; i++ {
		per := clientEntryBytes(b, 1_000_000, false)
		withBW := clientEntryBytes(b, 1_000_000, true)
		b.ReportMetric(per, "B/entry")
		b.ReportMetric(withBW, "B/entry-bw")
	}
}

// BenchmarkAdmitClient is the per-connection cost of a client limit: one
// client's admission and release.
func BenchmarkAdmitClient(b *testing.B) {
	cfg, vs := clientCfg(b, ClientLimits{}, ClientLimits{Limits: Limits{MaxConnections: 4, EnforceConnections: true}})
	a := NewAdmission(cfg, 0)
	c := netip.MustParseAddr("198.18.5.1")
	var tk Ticket
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if _, ok := a.AdmitClient(vs, c, &tk); !ok {
			b.Fatal("refused")
		}
		tk.Release()
	}
}

// recordingArbiter is a ClientArbiter over one map, as two members sharing
// it would see it: other is the count the rest of the cluster holds.
type recordingArbiter struct {
	other   int64
	asked   []clientAsk
	changed []string
}

func (r *recordingArbiter) Admit(scope, client string, n, seq, limit int64) (int64, bool) {
	r.asked = append(r.asked, clientAsk{name: scope + "/" + client, n: n, seq: seq, limit: limit})
	return r.other, r.other+n <= limit
}

func (r *recordingArbiter) Changed(scope, client string) {
	r.changed = append(r.changed, scope+"/"+client)
}

// TestClientArbiter: with an arbiter set, an enforced per-client
// maxConnections asks it after the local table admitted, with the count
// here and increasing sequence numbers; its refusal names the cluster-wide
// count and leaves nothing counted here; releases tell it; ClientCount
// and ClientsActive read the table back by the names it was given (an
// IPv4 address, an IPv6 /64 group).
func TestClientArbiter(t *testing.T) {
	cfg, vs := clientCfg(t, ClientLimits{}, ClientLimits{Limits: Limits{MaxConnections: 2, EnforceConnections: true}, PrefixV6: 64})
	a := NewAdmission(cfg, 0)
	arb := &recordingArbiter{}
	a.SetClientArbiter(arb)
	ca, c6 := netip.MustParseAddr("198.18.5.1"), netip.MustParseAddr("fd00:5::1")
	var t1, t2, t6 Ticket
	if _, ok := a.AdmitClient(vs, ca, &t1); !ok {
		t.Fatal("refused with the cluster empty")
	}
	arb.other = 1
	r, ok := a.AdmitClient(vs, ca, &t2)
	if want := "client 198.18.5.1: maxConnections 2 reached (2 open cluster-wide, 1 here)"; ok || r.Error() != want {
		t.Fatalf("second with 1 elsewhere: ok=%v %q, want %q", ok, r.Error(), want)
	}
	if n, _ := a.ClientCount("web", "198.18.5.1"); n != 1 {
		t.Fatalf("count here after the cluster's refusal %d, want 1", n)
	}
	if len(arb.asked) != 2 || arb.asked[0].n != 1 || arb.asked[1].n != 2 || arb.asked[1].seq <= arb.asked[0].seq ||
		arb.asked[0].name != "web/198.18.5.1" || arb.asked[0].limit != 2 {
		t.Fatalf("asked %+v", arb.asked)
	}
	arb.other = 0
	if _, ok := a.AdmitClient(vs, c6, &t6); !ok {
		t.Fatal("v6 client refused")
	}
	active := a.ClientsActive("web")
	if len(active) != 2 || !slices.Contains(active, "198.18.5.1") || !slices.Contains(active, "fd00:5::/64") {
		t.Fatalf("active %v", active)
	}
	if n, seq := a.ClientCount("web", "fd00:5::/64"); n != 1 || seq <= arb.asked[len(arb.asked)-1].seq {
		t.Fatalf("v6 count %d seq %d", n, seq)
	}
	t1.Release()
	t6.Release()
	if n, _ := a.ClientCount("web", "198.18.5.1"); n != 0 {
		t.Fatalf("count after release %d", n)
	}
	if !slices.Contains(arb.changed, "web/198.18.5.1") || !slices.Contains(arb.changed, "web/fd00:5::/64") {
		t.Fatalf("changed %v", arb.changed)
	}
	a.SetClientArbiter(nil)
	arb.other = 5
	if _, ok := a.AdmitClient(vs, ca, &t1); !ok {
		t.Fatal("refused after the arbiter was removed")
	}
}
