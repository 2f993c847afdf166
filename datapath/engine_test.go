package datapath

import (
	"net"
	"net/netip"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"weir/internal/testutil"
	"weir/policy"
)

// manualClock is an injectable clock for the engine.
type manualClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *manualClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *manualClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// engineRig is an engine over one end of a memory pair; client is the other
// end, standing for the network.
type engineRig struct {
	e      *Engine
	client *MemDevice
	clock  *manualClock
}

func newRig(t *testing.T, cfg *policy.Config, o EngineOptions) *engineRig {
	t.Helper()
	client, inner := NewPipe(PipeOptions{})
	t.Cleanup(func() { client.Close() })
	clk := &manualClock{now: time.Unix(1_000_000, 0)}
	o.Now = clk.Now
	return &engineRig{e: NewEngine(inner, cfg, o), client: client, clock: clk}
}

// ingress sends pkts from the client and returns what the engine's Read
// hands the stack.
func (r *engineRig) ingress(t *testing.T, pkts ...[]byte) [][]byte {
	t.Helper()
	if _, err := r.client.Write(pkts, 0); err != nil {
		t.Fatal(err)
	}
	bufs := makeBatch(len(pkts), 1500, 0)
	sizes := make([]int, len(pkts))
	var out [][]byte
	done := make(chan struct{})
	go func() {
		defer close(done)
		n, err := r.e.Read(bufs, sizes, 0)
		if err != nil {
			t.Errorf("Read: %v", err)
		}
		for i := range n {
			out = append(out, bufs[i][:sizes[i]])
		}
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		r.client.Close()
		<-done
		t.Fatal("engine Read did not return")
	}
	return out
}

// egress writes pkts as the stack and returns what reaches the client.
func (r *engineRig) egress(t *testing.T, pkts ...[]byte) [][]byte {
	t.Helper()
	if n, err := r.e.Write(pkts, 0); err != nil || n != len(pkts) {
		t.Fatalf("Write = %d, %v", n, err)
	}
	bufs := makeBatch(len(pkts), 1500, 0)
	sizes := make([]int, len(pkts))
	n, err := r.client.Read(bufs, sizes, 0)
	if err != nil || n != len(pkts) {
		t.Fatalf("client Read = %d, %v; want %d", n, err, len(pkts))
	}
	out := make([][]byte, n)
	for i := range n {
		out[i] = bufs[i][:sizes[i]]
	}
	return out
}

func tosOf(t *testing.T, b []byte) uint8 {
	t.Helper()
	var p Packet
	if r := Parse(b, &p); r != DropNone {
		t.Fatalf("packet does not parse: %v", r)
	}
	if p.Version == 4 && IPv4HeaderChecksum(b) != uint16(b[10])<<8|uint16(b[11]) {
		t.Fatalf("IPv4 header checksum wrong after the engine")
	}
	return p.TOS
}

func rst4(t *testing.T, src, dst net.IP, sport, dport uint16) []byte {
	ip := ip4(src, dst, layers.IPProtocolTCP)
	tc := tcp(sport, dport)
	tc.RST = true
	tc.SetNetworkLayerForChecksum(ip)
	return serialize(t, ip, tc)
}

func TestEngineMarksEgressPerFlow(t *testing.T) {
	r := newRig(t, testConfig(t), EngineOptions{})
	// Flows open from the client side; each one's replies are marked by its
	// action: www (premium, 0xa0) on 4 and 6, telnet (bulk, 0x20), api (none).
	in := r.ingress(t,
		tcp4(t, client4, vip4, 40000, 80, 0, true, false, 0),
		tcp6(t, client6, vip6, 40001, 80, 0, true, false, 0),
		tcp4(t, client4, vip4, 40002, 23, 0, true, false, 0),
		tcp4(t, client4, vip4, 40003, 443, 0x04, true, false, 0),
	)
	if len(in) != 4 {
		t.Fatalf("ingress passed %d packets, want 4", len(in))
	}
	tests := []struct {
		name string
		pkt  []byte
		want uint8
	}{
		{"syn-ack v4", tcp4(t, vip4, client4, 80, 40000, 0, true, true, 0), 0xa0},
		{"data v4 keeps ecn", tcp4(t, vip4, client4, 80, 40000, 0x02, false, true, 1000), 0xa2},
		{"rst v4", rst4(t, vip4, client4, 80, 40000), 0xa0},
		{"syn-ack v6", tcp6(t, vip6, client6, 80, 40001, 0, true, true, 0), 0xa0},
		{"telnet bulk", tcp4(t, vip4, client4, 23, 40002, 0, false, true, 10), 0x20},
		{"api unmarked", tcp4(t, vip4, client4, 443, 40003, 0x04, false, true, 10), 0x04},
		{"unknown flow, server port 80", tcp4(t, vip4, client4, 80, 50000, 0, false, true, 0), 0xa0},
		{"no service", tcp4(t, net.IP{198, 18, 9, 9}, client4, 80, 40000, 0, false, true, 0), 0x00},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := r.egress(t, tt.pkt)
			if got := tosOf(t, out[0]); got != tt.want {
				t.Errorf("ToS = %#x, want %#x", got, tt.want)
			}
		})
	}
	if got := r.e.Stats().Marked; got != 6 {
		t.Errorf("Marked = %d, want 6", got)
	}
	var tot MeterTotals
	r.e.Meters().Totals(&tot)
	if got := tot.Services[0][Ingress].Packets; got != 2 {
		t.Errorf("www ingress packets = %d, want 2", got)
	}
	if got := tot.Services[0][Egress].Packets; got != 5 {
		t.Errorf("www egress packets = %d, want 5", got)
	}
	if got := tot.Instance[Egress].Packets; got != uint64(len(tests)) {
		t.Errorf("instance egress packets = %d, want %d", got, len(tests))
	}
	if got := tot.NoService[Egress].Packets; got != 1 {
		t.Errorf("no-service egress packets = %d, want 1", got)
	}
}

func TestEngineMarksEveryPacketOfABurst(t *testing.T) {
	r := newRig(t, testConfig(t), EngineOptions{})
	r.ingress(t, tcp4(t, client4, vip4, 40000, 80, 0, true, false, 0))
	seg := tcp4(t, vip4, client4, 80, 40000, 0, false, true, 100)
	other := tcp4(t, vip4, client4, 443, 40000, 0, false, true, 100)
	out := r.egress(t, seg, append([]byte(nil), seg...), other, append([]byte(nil), seg...))
	for i, want := range []uint8{0xa0, 0xa0, 0, 0xa0} {
		if got := tosOf(t, out[i]); got != want {
			t.Errorf("packet %d ToS = %#x, want %#x", i, got, want)
		}
	}
	var tot MeterTotals
	r.e.Meters().Totals(&tot)
	if got := tot.Services[0][Egress]; got != (Counter{3, 3 * 140}) {
		t.Errorf("www egress = %v, want 3 packets", got)
	}
	if got := tot.Services[1][Egress]; got != (Counter{1, 140}) {
		t.Errorf("api egress = %v, want 1 packet", got)
	}
}

func TestEngineDropsMalformedIngress(t *testing.T) {
	r := newRig(t, testConfig(t), EngineOptions{})
	good := tcp4(t, client4, vip4, 40000, 80, 0, true, false, 0)
	short := good[:30]
	badVersion := append([]byte{0x55}, good[1:]...)
	frag := func() []byte {
		ip := ip4(client4, vip4, layers.IPProtocolTCP)
		ip.FragOffset = 100
		return serialize(t, ip, gopacket.Payload(make([]byte, 24)))
	}()
	out := r.ingress(t, short, good, badVersion, frag, good)
	if len(out) != 3 {
		t.Fatalf("ingress passed %d packets, want 3 (two good, one fragment)", len(out))
	}
	if string(out[0]) != string(good) || string(out[1]) != string(frag) || string(out[2]) != string(good) {
		t.Error("passed packets are not the good ones in order")
	}
	st := r.e.Stats()
	if st.Dropped[DropTruncated] != 1 || st.Dropped[DropBadVersion] != 1 || st.Fragments != 1 {
		t.Errorf("stats = %+v", st)
	}
	// A batch of nothing but garbage is dropped whole; Read waits for more.
	done := make(chan int)
	go func() {
		n, _ := r.e.Read(makeBatch(4, 1500, 0), make([]int, 4), 0)
		done <- n
	}()
	r.client.Write([][]byte{short, short}, 0)
	select {
	case n := <-done:
		t.Fatalf("Read returned %d for an all-garbage batch", n)
	case <-time.After(20 * time.Millisecond):
	}
	r.client.Write([][]byte{good}, 0)
	if n := <-done; n != 1 {
		t.Fatalf("Read = %d, want 1", n)
	}
	// Egress never drops: a malformed packet from the stack passes.
	out = r.egress(t, short)
	if string(out[0]) != string(short) {
		t.Error("malformed egress packet altered")
	}
	if got := r.e.Stats().EgressMalformed; got != 1 {
		t.Errorf("EgressMalformed = %d, want 1", got)
	}
}

func TestEngineConfigSwap(t *testing.T) {
	cfg := testConfig(t)
	r := newRig(t, cfg, EngineOptions{})
	r.ingress(t, tcp4(t, client4, vip4, 40000, 80, 0, true, false, 0))
	if got := tosOf(t, r.egress(t, tcp4(t, vip4, client4, 80, 40000, 0, true, true, 0))[0]); got != 0xa0 {
		t.Fatalf("before swap ToS = %#x", got)
	}
	// The new config sends www to the bulk action.
	next := testConfig(t)
	next.Rules[0].Action = next.Actions[1]
	r.e.SetConfig(next)
	if r.e.Generation() != 1 || r.e.Config() != next {
		t.Fatalf("generation %d after one swap", r.e.Generation())
	}
	if got := tosOf(t, r.egress(t, tcp4(t, vip4, client4, 80, 40000, 0, false, true, 0))[0]); got != 0x20 {
		t.Errorf("after swap ToS = %#x, want the new action's 0x20", got)
	}
	f := r.e.Flow(netip.MustParseAddrPort("198.18.0.2:40000"), netip.MustParseAddrPort("198.18.0.1:80"), ProtoTCP)
	if f == nil || f.Action != next.Actions[1] || f.Gen != 1 {
		t.Fatalf("flow after swap = %+v", f)
	}
	var tot MeterTotals
	r.e.Meters().Totals(&tot)
	if got := tot.Services[0]; got != (Traffic{{1, 40}, {2, 80}}) {
		t.Errorf("www after swap = %v, want the packets of both configs", got)
	}
	// Admission reads through the engine the bytes of admitted flows only:
	// this one was never bound to a target (never admitted), so none.
	if n, ok := r.e.ServiceBytes("www"); !ok || n != 0 {
		t.Errorf("ServiceBytes(www) after swap = %d, %v; want 0 (the flow was never admitted)", n, ok)
	}
}

func TestEngineBindTarget(t *testing.T) {
	r := newRig(t, testConfig(t), EngineOptions{})
	r.ingress(t, tcp4(t, client4, vip4, 40000, 80, 0, true, false, 0))
	f := r.e.Flow(netip.MustParseAddrPort("198.18.0.2:40000"), netip.MustParseAddrPort("198.18.0.1:80"), ProtoTCP)
	if f == nil || f.Service == nil || f.Service.Name != "www" || f.Action.Name != "premium" {
		t.Fatalf("flow = %+v", f)
	}
	id := r.e.Meters().TargetID(0, 1)
	f.Bind(id)
	r.egress(t, tcp4(t, vip4, client4, 80, 40000, 0, false, true, 60))
	r.ingress(t, tcp4(t, client4, vip4, 40000, 80, 0, false, true, 0))
	var tot MeterTotals
	r.e.Meters().Totals(&tot)
	if got := tot.Targets[id]; got != (Traffic{{1, 40}, {1, 100}}) {
		t.Errorf("target traffic = %v", got)
	}
}

// TestEngineBindSurvivesSwap binds a flow to a target, swaps to a config
// where the target moved (another index), and checks the reclassified flow
// still counts for it.
func TestEngineBindSurvivesSwap(t *testing.T) {
	r := newRig(t, testConfig(t), EngineOptions{})
	r.ingress(t, tcp4(t, client4, vip4, 40000, 80, 0, true, false, 0))
	client, server := netip.MustParseAddrPort("198.18.0.2:40000"), netip.MustParseAddrPort("198.18.0.1:80")
	r.e.Flow(client, server, ProtoTCP).Bind(r.e.Meters().TargetID(0, 1)) // www's second target

	next := testConfig(t)
	ts := next.Services[0].Targets
	ts[0], ts[1] = ts[1], ts[0] // now www's first
	next.Services[0], next.Services[1] = next.Services[1], next.Services[0]
	r.e.SetConfig(next)

	r.egress(t, tcp4(t, vip4, client4, 80, 40000, 0, false, true, 60))
	f := r.e.Flow(client, server, ProtoTCP)
	want := r.e.Meters().TargetID(1, 0)
	if f == nil || f.Gen != 1 || f.Target() != want {
		t.Fatalf("flow after swap: %+v, target %d, want %d", f, f.Target(), want)
	}
	var tot MeterTotals
	r.e.Meters().Totals(&tot)
	if got := tot.Targets[want][Egress]; got != (Counter{1, 100}) {
		t.Errorf("moved target egress = %v, want the packet after the swap", got)
	}
}

// connect sends a client's SYN and then its handshake ACK, which confirms
// the flow (no longer half-open).
func (r *engineRig) connect(t *testing.T, src, dst net.IP, sport, dport uint16) {
	t.Helper()
	r.ingress(t, tcp4(t, src, dst, sport, dport, 0, true, false, 0))
	r.ingress(t, tcp4(t, src, dst, sport, dport, 0, false, true, 0))
}

func TestEngineFlowExpiry(t *testing.T) {
	r := newRig(t, testConfig(t), EngineOptions{Flows: FlowTableOptions{IdleTimeout: time.Minute, Shards: 2}})
	r.connect(t, client4, vip4, 40000, 80)
	if got := r.e.Flows().Stats().Flows; got != 1 {
		t.Fatalf("flows = %d, want 1", got)
	}
	// One shard is swept every IdleTimeout/4/shards from Read or Write;
	// after two minutes of silence, as many packets as there are shards
	// have swept them all and removed the flow.
	r.clock.Advance(2 * time.Minute)
	for i := range 2 {
		r.connect(t, client4, vip4, uint16(40001+i), 80)
		r.clock.Advance(8 * time.Second)
	}
	st := r.e.Flows().Stats()
	if st.Expired != 1 || st.Flows != 2 {
		t.Fatalf("flow stats = %+v, want 1 expired, 2 live", st)
	}
}

func TestEngineFullTableStillClassifies(t *testing.T) {
	r := newRig(t, testConfig(t), EngineOptions{Flows: FlowTableOptions{MaxFlows: 1, Shards: 1}})
	r.connect(t, client4, vip4, 40000, 80) // a confirmed flow fills the table
	r.ingress(t, tcp4(t, client4, vip4, 40001, 80, 0, true, false, 0))
	if got := tosOf(t, r.egress(t, tcp4(t, vip4, client4, 80, 40001, 0, true, true, 0))[0]); got != 0xa0 {
		t.Errorf("uncached flow ToS = %#x, want 0xa0", got)
	}
	if st := r.e.Stats(); st.Uncached != 2 {
		t.Errorf("Uncached = %d, want 2", st.Uncached)
	}
	if st := r.e.Flows().Stats(); st.Refused != 2 || st.Evicted != 0 {
		t.Errorf("flow stats %+v, want 2 refused (the SYN and the SYN-ACK), none evicted", st)
	}
}

func TestEngineWorkersShareState(t *testing.T) {
	r := newRig(t, testConfig(t), EngineOptions{Workers: 4})
	const total = 800
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			port := r.e.Worker(w)
			bufs := makeBatch(16, 1500, 0)
			sizes := make([]int, 16)
			for {
				if _, err := port.Read(bufs, sizes, 0); err != nil {
					return
				}
			}
		}()
	}
	for i := 0; i < total; i += 100 {
		pkts := make([][]byte, 0, 100)
		for j := i; j < i+100; j++ {
			pkts = append(pkts, tcp4(t, client4, vip4, uint16(10000+j%50), 80, 0, false, true, 0))
		}
		r.client.Write(pkts, 0)
	}
	var tot MeterTotals
	testutil.Within(10*time.Second, func() bool {
		r.e.Meters().Totals(&tot)
		return tot.Instance[Ingress].Packets >= total
	})
	r.client.Close()
	wg.Wait()
	if got := tot.Services[0][Ingress].Packets; got != total {
		t.Errorf("www ingress packets = %d, want %d", got, total)
	}
	if got := r.e.Flows().Stats().Flows; got != 50 {
		t.Errorf("flows = %d, want 50", got)
	}
}

// TestEngineConcurrentWrites writes egress from many goroutines at once,
// as gVisor does, over flows created by ingress: every packet is metered
// and marked exactly once. Run it under -race.
func TestEngineConcurrentWrites(t *testing.T) {
	eg, in := pathPackets(t, false, 16)
	e := NewEngine(&sinkDevice{pkts: in}, testConfig(t), EngineOptions{})
	e.Read(makeBatch(16, 1500, 0), make([]int, 16), 0)
	const writers, rounds = 8, 200
	var wg sync.WaitGroup
	for range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			own := make([][]byte, len(eg))
			for i := range eg {
				own[i] = append([]byte(nil), eg[i]...)
			}
			for range rounds {
				for _, p := range own {
					SetTOS(p, 0)
				}
				e.Write(own, 0)
			}
		}()
	}
	wg.Wait()
	n := uint64(writers * rounds * len(eg))
	var tot MeterTotals
	e.Meters().Totals(&tot)
	if got := tot.Services[0][Egress].Packets; got != n {
		t.Errorf("www egress packets = %d, want %d", got, n)
	}
	if got := e.Stats().Marked; got != n {
		t.Errorf("Marked = %d, want %d", got, n)
	}
}

func TestEngineClose(t *testing.T) {
	r := newRig(t, testConfig(t), EngineOptions{})
	done := make(chan error)
	go func() {
		_, err := r.e.Read(makeBatch(1, 1500, 0), []int{0}, 0)
		done <- err
	}()
	time.Sleep(10 * time.Millisecond)
	r.e.Close()
	if err := <-done; err != os.ErrClosed {
		t.Errorf("Read after Close = %v, want os.ErrClosed", err)
	}
}

// sinkDevice is a Device whose Write discards and whose Read returns a
// fixed batch, for measuring the engine alone.
type sinkDevice struct {
	pkts [][]byte
}

func (d *sinkDevice) Read(bufs [][]byte, sizes []int, offset int) (int, error) {
	n := min(len(bufs), len(d.pkts))
	for i := range n {
		sizes[i] = copy(bufs[i][offset:], d.pkts[i])
	}
	return n, nil
}
func (d *sinkDevice) Write(bufs [][]byte, offset int) (int, error) { return len(bufs), nil }
func (d *sinkDevice) BatchSize() int                               { return 64 }
func (d *sinkDevice) MTU() int                                     { return 1500 }
func (d *sinkDevice) Close() error                                 { return nil }

// onceDevice returns its packets from the first Read and os.ErrClosed
// after; Write discards.
type onceDevice struct {
	sinkDevice
	done bool
}

func (d *onceDevice) Read(bufs [][]byte, sizes []int, offset int) (int, error) {
	if d.done {
		return 0, os.ErrClosed
	}
	d.done = true
	return d.sinkDevice.Read(bufs, sizes, offset)
}

// pathPackets returns n egress packets of n distinct flows to www, IPv4 or
// IPv6, and the matching ingress packets.
func pathPackets(t testing.TB, v6 bool, n int) (egress, ingress [][]byte) {
	for i := range n {
		port := uint16(20000 + i)
		if v6 {
			egress = append(egress, tcp6(t, vip6, client6, 80, port, 0, false, true, 0))
			ingress = append(ingress, tcp6(t, client6, vip6, port, 80, 0, false, true, 0))
		} else {
			egress = append(egress, tcp4(t, vip4, client4, 80, port, 0, false, true, 0))
			ingress = append(ingress, tcp4(t, client4, vip4, port, 80, 0, false, true, 0))
		}
	}
	return egress, ingress
}

func TestEnginePathZeroAllocs(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		eg, in := pathPackets(t, v6, 64)
		e := NewEngine(&sinkDevice{pkts: in}, testConfig(t), EngineOptions{})
		bufs := makeBatch(64, 1500, 0)
		sizes := make([]int, 64)
		e.Read(bufs, sizes, 0) // create the flows
		allocs := testing.AllocsPerRun(100, func() {
			e.Read(bufs, sizes, 0)
			e.Write(eg, 0)
		})
		if allocs != 0 {
			t.Errorf("v6=%v: per-batch path allocates %.1f times, want 0", v6, allocs)
		}
		if e.Stats().Marked == 0 {
			t.Errorf("v6=%v: nothing marked", v6)
		}
	}
}

// unmark restores the unmarked ToS (and IPv4 checksum) of the benchmark's
// packets, so that every packet is rewritten again: three byte stores.
func unmark(pkts [][]byte, v6 bool) {
	for _, p := range pkts {
		if v6 {
			p[0], p[1] = 0x60, p[1]&0x0f
		} else {
			p[1], p[10], p[11] = 0, unmarkedSum[0], unmarkedSum[1]
		}
	}
}

// unmarkedSum is the IPv4 header checksum of the benchmark's egress
// packets with ToS 0; they differ only in the TCP port, outside the IP
// header.
var unmarkedSum [2]byte

// BenchmarkEnginePath measures the whole per-packet path on established
// flows: egress (parse → flow lookup → meter → mark) and ingress (parse →
// lookup → meter), IPv4 and IPv6 TCP, in batches of 64 over 64 flows. One
// op is one packet.
func BenchmarkEnginePath(b *testing.B) {
	for _, v6 := range []bool{false, true} {
		name := "ipv4"
		if v6 {
			name = "ipv6"
		}
		eg, in := pathPackets(b, v6, 64)
		if !v6 {
			unmarkedSum = [2]byte{eg[0][10], eg[0][11]}
		}
		cfg := testConfig(b)
		b.Run(name+"/egress", func(b *testing.B) {
			e := NewEngine(&sinkDevice{pkts: in}, cfg, EngineOptions{})
			e.Read(makeBatch(64, 1500, 0), make([]int, 64), 0)
			b.ReportAllocs()
			b.ResetTimer()
			cpu := threadCPU()
			start := time.Now()
			for i := 0; i < b.N; i += 64 {
				// Clear the mark so that every packet is rewritten.
				unmark(eg, v6)
				e.Write(eg, 0)
			}
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "pkts/s")
			b.ReportMetric(float64(cpu())/float64(b.N), "cpu-ns/pkt")
		})
		b.Run(name+"/egress-16k-flows", func(b *testing.B) {
			// 16384 flows, visited round robin in batches of 64: flow
			// entries and slot arrays no longer sit in the L1/L2 caches.
			const flows = 16384
			eg, _ := pathPackets(b, v6, flows)
			e := NewEngine(&sinkDevice{}, cfg, EngineOptions{})
			for i := 0; i < flows; i += 64 {
				e.Write(eg[i:i+64], 0) // egress creates the flows too
			}
			if got := e.Flows().Stats().Flows; got != flows {
				b.Fatalf("%d flows, want %d", got, flows)
			}
			b.ReportAllocs()
			b.ResetTimer()
			cpu := threadCPU()
			start := time.Now()
			for i := 0; i < b.N; i += 64 {
				batch := eg[i%flows : i%flows+64]
				unmark(batch, v6)
				e.Write(batch, 0)
			}
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "pkts/s")
			b.ReportMetric(float64(cpu())/float64(b.N), "cpu-ns/pkt")
		})
		b.Run(name+"/egress-burst", func(b *testing.B) {
			// 64 segments of one flow per batch, as a TSO-sized write
			// from the stack arrives.
			e := NewEngine(&sinkDevice{pkts: in}, cfg, EngineOptions{})
			e.Read(makeBatch(64, 1500, 0), make([]int, 64), 0)
			burst := make([][]byte, 64)
			for i := range burst {
				burst[i] = append([]byte(nil), eg[0]...)
			}
			b.ReportAllocs()
			b.ResetTimer()
			cpu := threadCPU()
			start := time.Now()
			for i := 0; i < b.N; i += 64 {
				unmark(burst, v6)
				e.Write(burst, 0)
			}
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "pkts/s")
			b.ReportMetric(float64(cpu())/float64(b.N), "cpu-ns/pkt")
		})
		b.Run(name+"/ingress", func(b *testing.B) {
			e := NewEngine(&sinkDevice{pkts: in}, cfg, EngineOptions{})
			bufs := makeBatch(64, 1500, 0)
			sizes := make([]int, 64)
			e.Read(bufs, sizes, 0)
			b.ReportAllocs()
			b.ResetTimer()
			cpu := threadCPU()
			start := time.Now()
			for i := 0; i < b.N; i += 64 {
				e.Read(bufs, sizes, 0)
			}
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "pkts/s")
			b.ReportMetric(float64(cpu())/float64(b.N), "cpu-ns/pkt")
		})
	}
}

// FuzzEngine sends arbitrary bytes through the engine both ways: it must
// not panic, must pass on only packets that parse, and must keep a valid
// IPv4 header checksum valid when it marks.
func FuzzEngine(f *testing.F) {
	f.Add(tcp4(f, client4, vip4, 40000, 80, 0, true, false, 0), tcp4(f, vip4, client4, 80, 40000, 0, true, true, 0))
	f.Add(tcp6(f, client6, vip6, 40000, 80, 0, true, false, 0), tcp6(f, vip6, client6, 80, 40000, 0, true, true, 0))
	f.Add([]byte{0x45, 0}, []byte{0x60})
	cfg := testConfig(f)
	f.Fuzz(func(t *testing.T, in, out []byte) {
		e := NewEngine(&onceDevice{sinkDevice: sinkDevice{pkts: [][]byte{in, in}}}, cfg, EngineOptions{Flows: FlowTableOptions{MaxFlows: 4}})
		bufs := makeBatch(2, len(in)+1, 0)
		sizes := make([]int, 2)
		n, _ := e.Read(bufs, sizes, 0)
		var p Packet
		for i := range n {
			if Parse(bufs[i][:sizes[i]], &p) != DropNone {
				t.Fatalf("ingress passed a packet that does not parse")
			}
		}
		b := append([]byte(nil), out...)
		valid := len(b) >= 20 && b[0]>>4 == 4 && Parse(b, &p) == DropNone && IPv4HeaderChecksum(b) == uint16(b[10])<<8|uint16(b[11])
		e.Write([][]byte{b}, 0)
		if valid && IPv4HeaderChecksum(b) != uint16(b[10])<<8|uint16(b[11]) {
			t.Fatalf("egress broke a valid IPv4 checksum")
		}
	})
}

// TestEngineWriteShortBuffer: a buffer shorter than the write offset holds
// no packet; it is passed on and counted, not skipped silently.
func TestEngineWriteShortBuffer(t *testing.T) {
	r := newRig(t, testConfig(t), EngineOptions{})
	pkt := tcp4(t, vip4, client4, 80, 40000, 0, true, true, 0)
	buf := append(make([]byte, 4), pkt...)
	if _, err := r.e.Write([][]byte{buf, make([]byte, 2)}, 4); err != nil {
		t.Fatal(err)
	}
	if got := r.e.Stats().EgressMalformed; got != 1 {
		t.Errorf("EgressMalformed = %d, want 1 (the 2-byte buffer)", got)
	}
}
