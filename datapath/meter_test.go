package datapath

import (
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"weir/policy"
)

// testConfig builds a compiled config with nested classes: web ⊂ gold,
// two services (www in web, api directly under gold), one ungrouped
// service (telnet), two actions and rules selecting them.
func testConfig(t testing.TB) *policy.Config {
	t.Helper()
	gold := &policy.Class{Name: "gold"}
	web := &policy.Class{Name: "web", Parent: gold}
	vip4, vip6 := netip.MustParseAddr("198.18.0.1"), netip.MustParseAddr("fd00::1")
	www := &policy.VirtualServer{Name: "www", Class: web, VIPs: []netip.Addr{vip4, vip6}, Ports: policy.PortRange{Lo: 80, Hi: 80},
		Targets: []*policy.Target{{Addr: netip.MustParseAddrPort("198.18.1.1:8080")}, {Addr: netip.MustParseAddrPort("198.18.1.2:8080")}}}
	api := &policy.VirtualServer{Name: "api", Class: gold, VIPs: []netip.Addr{vip4}, Ports: policy.PortRange{Lo: 443, Hi: 443},
		Targets: []*policy.Target{{Addr: netip.MustParseAddrPort("198.18.2.1:8443")}}}
	telnet := &policy.VirtualServer{Name: "telnet", VIPs: []netip.Addr{vip4}, Ports: policy.PortRange{Lo: 23, Hi: 23}}
	premium := &policy.Action{Name: "premium", OutgoingTOS: 0xa0, SetTOS: true}
	bulk := &policy.Action{Name: "bulk", OutgoingTOS: 0x20, SetTOS: true, MinRate: 500}
	cfg := &policy.Config{
		Classes:  []*policy.Class{gold, web},
		Services: []*policy.VirtualServer{www, api, telnet},
		Actions:  []*policy.Action{premium, bulk},
		Rules: []*policy.Rule{
			{Name: "www", SrcPort: policy.PortRange{Lo: 80, Hi: 80}, Service: www, Action: premium},
			{Name: "telnet", SrcPort: policy.PortRange{Lo: 23, Hi: 23}, Action: bulk},
		},
	}
	c, err := policy.Compile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestMetersTotals(t *testing.T) {
	cfg := testConfig(t)
	m := NewMeters(cfg, 4)
	www, api := 0, 1
	premium := 0
	// Flows spread over shards; the reader must see their sum.
	m.Add(0, m.Row(www, premium), int32(m.TargetID(www, 1)), Ingress, 100, 0)
	m.Add(1, m.Row(www, premium), NoTarget, Egress, 1000, 0)
	m.Add(2, m.Row(api, -1), int32(m.TargetID(api, 0)), Egress, 50, 0)
	m.Add(7, m.NoRow(), NoTarget, Ingress, 7, 0) // shard 7 wraps onto shard 3
	var tot MeterTotals
	m.Totals(&tot)
	want := MeterTotals{
		Instance:  Traffic{{2, 107}, {2, 1050}},
		Classes:   []Traffic{{{1, 100}, {2, 1050}}, {{1, 100}, {1, 1000}}}, // gold, web
		Services:  []Traffic{{{1, 100}, {1, 1000}}, {{0, 0}, {1, 50}}, {}},
		Actions:   []Traffic{{{1, 100}, {1, 1000}}, {}},
		Targets:   []Traffic{{}, {{1, 100}, {}}, {{}, {1, 50}}},
		NoService: Traffic{{1, 7}, {}},
		NoAction:  Traffic{{1, 7}, {1, 50}},
	}
	checkTotals(t, &tot, &want)
	if m.TargetID(www, 2) != NoTarget || m.TargetID(5, 0) != NoTarget {
		t.Error("TargetID of a missing target is not NoTarget")
	}
}

func checkTotals(t *testing.T, got, want *MeterTotals) {
	t.Helper()
	eq := func(name string, g, w []Traffic) {
		if len(g) != len(w) {
			t.Errorf("%s: %d entries, want %d", name, len(g), len(w))
			return
		}
		for i := range g {
			if g[i] != w[i] {
				t.Errorf("%s[%d] = %v, want %v", name, i, g[i], w[i])
			}
		}
	}
	eq("Instance", []Traffic{got.Instance}, []Traffic{want.Instance})
	eq("Classes", got.Classes, want.Classes)
	eq("Services", got.Services, want.Services)
	eq("Actions", got.Actions, want.Actions)
	eq("Targets", got.Targets, want.Targets)
	eq("NoService", []Traffic{got.NoService}, []Traffic{want.NoService})
	eq("NoAction", []Traffic{got.NoAction}, []Traffic{want.NoAction})
}

// TestMetersSunExample runs the seed's example through the one byte path,
// meters → Admission.Recompute (Meters.ServiceBytes, both directions), with
// a manual clock: 5000 bytes at t = 1 s with a 30 s window read 166 B/s at
// the service, its classes and the instance from 1 s through 30 s, and 0 at
// 32 s.
func TestMetersSunExample(t *testing.T) {
	cfg := testConfig(t)
	m := NewMeters(cfg, 2)
	adm := policy.NewAdmission(cfg, 0)
	t0 := time.Unix(1_000_000, 0)
	adm.Recompute(t0, m)
	want := map[time.Duration]int64{1 * time.Second: 166, 30 * time.Second: 166, 32 * time.Second: 0}
	tg := int32(m.TargetID(0, 0))
	for at := 100 * time.Millisecond; at <= 32*time.Second; at += 100 * time.Millisecond {
		if at == time.Second {
			// An admitted connection (bound to its target): 5000 payload
			// bytes in segments of 1000 with 40 header bytes each.
			for range 4 {
				m.Add(1, m.Row(0, 0), tg, Egress, 1040, 1000)
			}
			m.Add(0, m.Row(0, 1), tg, Ingress, 1040, 1000) // another action, the same service
			m.Add(0, m.Row(0, 0), tg, Ingress, 40, 0)      // a pure ACK: no payload
			// A refused connection (never bound): its handshake and 503
			// page count toward no level.
			m.Add(0, m.Row(0, 0), NoTarget, Egress, 1500, 1460)
			m.Add(0, m.NoRow(), NoTarget, Ingress, 777, 737) // no service: no level's
		}
		adm.Recompute(t0.Add(at), m)
		w, ok := want[at]
		if !ok {
			continue
		}
		for _, l := range adm.Snapshot() {
			exp := w
			if l.Name == "api" || l.Name == "telnet" {
				exp = 0
			}
			if l.Bandwidth != exp {
				t.Errorf("%v: %v %s rate = %d B/s, want %d", at, l.Level, l.Name, l.Bandwidth, exp)
			}
		}
	}
	if n, ok := m.ServiceBytes("www"); !ok || n != 5000 {
		t.Errorf("ServiceBytes(www) = %d, %v", n, ok)
	}
	if _, ok := m.ServiceBytes("nowhere"); ok {
		t.Error("ServiceBytes knows a service the config lacks")
	}
	if n := testing.AllocsPerRun(100, func() { m.ServiceBytes("www") }); n != 0 {
		t.Errorf("ServiceBytes allocates %v", n)
	}
}

// TestMetersPayloadOrWire: 7000 payload bytes in a 10 s window read 700 B/s
// (the Sun seed counts application bytes; wire bytes read 784 with the
// headers of 7 segments and 56 pure ACKs), and 784 with bandwidthBytes: wire.
func TestMetersPayloadOrWire(t *testing.T) {
	for _, tc := range []struct {
		count policy.ByteCount
		want  int64
	}{{policy.CountPayload, 700}, {policy.CountWire, 784}} {
		t.Run(tc.count.String(), func(t *testing.T) {
			cfg := testConfig(t)
			cfg.Instance.MetricInterval = 10 * time.Second
			cfg.Instance.BandwidthBytes = tc.count
			m := NewMeters(cfg, 1)
			adm := policy.NewAdmission(cfg, 0)
			t0 := time.Unix(0, 0)
			adm.Recompute(t0, m)
			tg := int32(m.TargetID(0, 1))
			for range 7 {
				m.Add(0, m.Row(0, 0), tg, Egress, 1040, 1000) // 7000 payload bytes, 280 header bytes
			}
			for range 14 {
				m.Add(0, m.Row(0, 0), tg, Ingress, 40, 0) // ACKs: 560 bytes, no payload
			}
			adm.Recompute(t0.Add(time.Second), m)
			for _, l := range adm.Snapshot() {
				if l.Name == "www" && l.Bandwidth != tc.want {
					t.Errorf("www: %d B/s, want %d", l.Bandwidth, tc.want)
				}
			}
		})
	}
}

// TestPayloadLen reads the TCP and UDP payload of parsed packets.
func TestPayloadLen(t *testing.T) {
	for _, tc := range []struct {
		name string
		pkt  []byte
		want int
	}{
		{"TCP, 20-byte header, 100 bytes", tcp4(t, client4, vip4, 40000, 80, 0, false, true, 100), 100},
		{"TCP, pure ACK", tcp4(t, client4, vip4, 40000, 80, 0, false, true, 0), 0},
	} {
		var p Packet
		if r := Parse(tc.pkt, &p); r != DropNone {
			t.Fatalf("%s: parse %v", tc.name, r)
		}
		if got := PayloadLen(tc.pkt, &p); got != tc.want {
			t.Errorf("%s: payload %d, want %d", tc.name, got, tc.want)
		}
	}
}

// TestTargetIDIsPolicyIndex: the meters number targets as policy's
// Config.TargetIndex does, so a flow is bound by that index.
func TestTargetIDIsPolicyIndex(t *testing.T) {
	cfg := testConfig(t)
	m := NewMeters(cfg, 1)
	for si, vs := range cfg.Services {
		for ti, tg := range vs.Targets {
			if got, want := m.TargetID(si, ti), cfg.TargetIndex(tg); got != want {
				t.Errorf("%s target %d: meter ID %d, policy index %d", vs.Name, ti, got, want)
			}
		}
	}
}

// TestMetersCarry swaps to a config where a service and an action are
// renamed away and checks that no byte of the instance total is lost and
// that surviving names keep their counts.
func TestMetersCarry(t *testing.T) {
	old := testConfig(t)
	m := NewMeters(old, 2)
	m.Add(0, m.Row(0, 0), int32(m.TargetID(0, 1)), Egress, 1000, 960) // www, premium, target 2
	m.Add(1, m.Row(1, 1), NoTarget, Ingress, 10, 0)                   // api, bulk

	next := testConfig(t)
	next.Services[1].Name = "api2" // api disappears
	n := NewMeters(next, 2)
	carried := n.carry(m, nil)
	// Late packets on the old meters are carried by a second pass.
	m.Add(1, m.Row(0, 0), NoTarget, Egress, 1, 0)
	n.carry(m, carried)

	var tot MeterTotals
	n.Totals(&tot)
	if got := tot.Instance; got != (Traffic{{1, 10}, {2, 1001}}) {
		t.Errorf("instance = %v, want all old traffic", got)
	}
	if got := tot.Services[0]; got != (Traffic{{}, {2, 1001}}) {
		t.Errorf("www = %v", got)
	}
	if got := tot.Services[1]; got != (Traffic{}) {
		t.Errorf("api2 = %v, want nothing carried from api", got)
	}
	if got := tot.NoService; got != (Traffic{{1, 10}, {}}) {
		t.Errorf("no-service = %v, want api's traffic", got)
	}
	if got := tot.Actions[1]; got != (Traffic{{1, 10}, {}}) {
		t.Errorf("bulk = %v", got)
	}
	if got := tot.Targets[1]; got != (Traffic{{}, {1, 1000}}) {
		t.Errorf("www target 2 = %v", got)
	}
	if got, _ := n.ServiceBytes("www"); got != 960 {
		t.Errorf("www payload after the swap = %d, want the 960 carried", got)
	}
}

// TestMetersConcurrent has workers add to their own shards, two of them
// sharing one shard by mistake, while a reader sums: the final totals are
// exact. Run it under -race.
func TestMetersConcurrent(t *testing.T) {
	m := NewMeters(testConfig(t), 4)
	const per = 10000
	shards := []int{0, 1, 2, 2} // workers 2 and 3 share shard 2
	var wg sync.WaitGroup
	stop := make(chan struct{})
	go func() {
		var tot MeterTotals
		for {
			select {
			case <-stop:
				return
			default:
				m.Totals(&tot)
			}
		}
	}()
	for _, sh := range shards {
		wg.Add(1)
		go func() {
			defer wg.Done()
			row := m.Row(0, 0)
			for range per {
				m.Add(sh, row, 0, Egress, 100, 0)
			}
		}()
	}
	wg.Wait()
	close(stop)
	var tot MeterTotals
	m.Totals(&tot)
	n := uint64(len(shards) * per)
	if got := tot.Services[0][Egress]; got != (Counter{n, 100 * n}) {
		t.Errorf("www egress = %v, want %d packets", got, n)
	}
	if got := tot.Targets[0][Egress]; got != (Counter{n, 100 * n}) {
		t.Errorf("target 0 egress = %v, want %d packets", got, n)
	}
}

func TestMetersAddZeroAllocs(t *testing.T) {
	m := NewMeters(testConfig(t), 4)
	row := m.Row(0, 0)
	allocs := testing.AllocsPerRun(1000, func() {
		m.Add(1, row, 1, Egress, 1500, 0)
	})
	if allocs != 0 {
		t.Errorf("Add allocates %.1f times, want 0", allocs)
	}
}

// BenchmarkMeters compares, in one run, per-core shards (each goroutine
// adds to its own shard) with a single shared pair of atomic counters, the
// design the shards replace. The shards should scale with goroutines; the
// shared counter's cache line bounces between cores. Besides wall-clock
// pkts/s it reports the CPU time per add summed over the goroutines'
// threads (cpu-ns/op), which coherence stalls inflate but waiting for a
// busy host's cores does not, and both ratios.
func BenchmarkMeters(b *testing.B) {
	cfg := testConfig(b)
	type result struct{ pps, cpuNs float64 }
	run := func(b *testing.B, add func(shard int)) result {
		var next atomic.Int64
		var cpuTotal atomic.Int64
		b.ReportAllocs()
		b.ResetTimer()
		start := time.Now()
		b.RunParallel(func(pb *testing.PB) {
			cpu := threadCPU()
			shard := int(next.Add(1) - 1)
			for pb.Next() {
				add(shard)
			}
			cpuTotal.Add(int64(cpu()))
		})
		r := result{float64(b.N) / time.Since(start).Seconds(), float64(cpuTotal.Load()) / float64(b.N)}
		b.ReportMetric(r.pps, "pkts/s")
		b.ReportMetric(r.cpuNs, "cpu-ns/op")
		return r
	}
	var sharded result
	b.Run("sharded", func(b *testing.B) {
		m := NewMeters(cfg, 64)
		row := m.Row(0, 0)
		sharded = run(b, func(shard int) { m.Add(shard, row, NoTarget, Egress, 1500, 0) })
	})
	b.Run("shared", func(b *testing.B) {
		var c struct {
			_              [64]byte
			packets, bytes atomic.Uint64
		}
		shared := run(b, func(int) {
			c.packets.Add(1)
			c.bytes.Add(1500)
		})
		if shared.pps > 0 && sharded.pps > 0 && sharded.cpuNs > 0 {
			b.ReportMetric(sharded.pps/shared.pps, "sharded/shared-pps")
			b.ReportMetric(shared.cpuNs/sharded.cpuNs, "shared/sharded-cpu")
		}
	})
}
