package datapath

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"weir/policy"
)

// spoofed4 is the IPv4 address of spoofed source i in 198.19.0.0/16.
func spoofed4(i int) net.IP { return net.IP{198, 19, byte(i >> 8), byte(i)} }

// synFlood sends n spoofed SYNs to vip4:80 in batches, as the stack would
// see them: each a new flow that never sends its ACK.
func (r *engineRig) synFlood(t *testing.T, first, n int) {
	t.Helper()
	var batch [][]byte
	for i := first; i < first+n; i++ {
		batch = append(batch, tcp4(t, spoofed4(i), vip4, uint16(1024+i%60000), 80, 0, true, false, 0))
		if len(batch) == 64 {
			r.ingress(t, batch...)
			batch = batch[:0]
		}
	}
	if len(batch) > 0 {
		r.ingress(t, batch...)
	}
}

// TestHalfOpenFlowsExpireWithinHandshake: flows of spoofed SYNs are
// half-open and leave the table within timeouts.handshake, on the manual
// clock, while a confirmed flow (its client's ACK came) stays for the idle
// timeout.
func TestHalfOpenFlowsExpireWithinHandshake(t *testing.T) {
	r := newRig(t, testConfig(t), EngineOptions{Flows: FlowTableOptions{IdleTimeout: 5 * time.Minute, Shards: 4}})
	r.connect(t, client4, vip4, 40000, 80)
	r.synFlood(t, 256, 200)
	st := r.e.Flows().Stats()
	if st.Flows != 201 || st.HalfOpen != 200 {
		t.Fatalf("after the flood: %+v, want 201 flows, 200 half-open", st)
	}
	real := r.e.Flow(netip.MustParseAddrPort("198.18.0.2:40000"), netip.MustParseAddrPort("198.18.0.1:80"), ProtoTCP)
	if real == nil || real.HalfOpen() {
		t.Fatalf("the real client's flow %+v: missing or still half-open after its ACK", real)
	}
	// The config's handshake timeout is the default, 5 s: a shard is swept
	// every 5 s/4/4 shards; a packet per step drives the sweep.
	step := policy.DefaultHandshakeTimeout / 16
	var took time.Duration
	for took < 2*policy.DefaultHandshakeTimeout && r.e.Flows().Stats().HalfOpen > 0 {
		r.clock.Advance(step)
		took += step
		r.ingress(t, tcp4(t, client4, vip4, 40000, 80, 0, false, true, 0))
	}
	st = r.e.Flows().Stats()
	t.Logf("half-open flows gone %v after the flood: %+v", took, st)
	if st.HalfOpen != 0 || st.Flows != 1 || st.Expired != 200 {
		t.Fatalf("%v after the flood: %+v, want the 200 half-open flows expired, 1 left", took, st)
	}
	if took > policy.DefaultHandshakeTimeout {
		t.Errorf("half-open flows lived %v, timeouts.handshake is %v", took, policy.DefaultHandshakeTimeout)
	}
	if f := r.e.Flow(netip.MustParseAddrPort("198.18.0.2:40000"), netip.MustParseAddrPort("198.18.0.1:80"), ProtoTCP); f != real {
		t.Errorf("the confirmed flow went with the half-open ones")
	}
}

// TestFullTableEvictsHalfOpenFirst: a table filled by a SYN flood takes
// every real connection that arrives during and after it, evicting
// half-open flows and never a confirmed one; each real flow is there for
// admission to bind, so its traffic is metered per target; a table full of
// confirmed flows refuses, and counts it.
func TestFullTableEvictsHalfOpenFirst(t *testing.T) {
	const max = 256
	r := newRig(t, testConfig(t), EngineOptions{Flows: FlowTableOptions{MaxFlows: max, Shards: 1}})
	r.synFlood(t, 256, 4*max)
	if st := r.e.Flows().Stats(); st.Flows != max || st.HalfOpen != max || st.Refused != 0 || st.Evicted != 3*max {
		t.Fatalf("after the flood: %+v, want %d half-open flows, %d evicted, none refused", st, max, 3*max)
	}
	id := r.e.Meters().TargetID(0, 1)
	var want Traffic
	const reals = max / 2
	for i := range reals {
		port := uint16(40000 + i)
		r.connect(t, client4, vip4, port, 80)
		// Admission finds the flow and binds it to its target.
		f := r.e.Flow(netip.AddrPortFrom(netip.MustParseAddr("198.18.0.2"), port), netip.MustParseAddrPort("198.18.0.1:80"), ProtoTCP)
		if f == nil {
			t.Fatalf("real connection %d: no flow to bind (the flood kept it out)", i)
		}
		f.Bind(id)
		r.ingress(t, tcp4(t, client4, vip4, port, 80, 0, false, true, 10))
		want[Ingress].Packets++
		want[Ingress].Bytes += 50
		// More flood between the real connections.
		r.synFlood(t, 256+4*max+i*8, 8)
	}
	var tot MeterTotals
	r.e.Meters().Totals(&tot)
	if got := tot.Targets[id]; got[Ingress] != want[Ingress] {
		t.Errorf("target traffic %v, want %v: a real connection was not metered per target", got, want)
	}
	st := r.e.Flows().Stats()
	t.Logf("%d real connections in a flooded table of %d: %+v, uncached %d", reals, max, st, r.e.Stats().Uncached)
	if st.Refused != 0 || r.e.Stats().Uncached != 0 {
		t.Errorf("refused %d, uncached %d: a flooded table with half-open flows to evict refused", st.Refused, r.e.Stats().Uncached)
	}
	if st.Flows != max || st.HalfOpen != max-reals {
		t.Errorf("%+v: want %d flows, %d of them half-open", st, max, max-reals)
	}
	// Fill the rest with confirmed flows: now the table refuses, and says so.
	for i := range max - reals {
		r.connect(t, client4, vip4, uint16(50000+i), 80)
	}
	if st := r.e.Flows().Stats(); st.HalfOpen != 0 || st.Flows != max {
		t.Fatalf("%+v: want the table full of confirmed flows", st)
	}
	before := r.e.Flows().Stats().Refused
	r.synFlood(t, 60000, 10)
	if st := r.e.Flows().Stats(); st.Refused-before != 10 || st.Flows != max {
		t.Errorf("%+v: 10 SYNs to a table full of confirmed flows, want 10 refused", st)
	}
}

// TestFloodedTableDrainsWithoutTraffic: a table a SYN flood filled drains
// within timeouts.handshake when no packet passes after the flood, as
// long as the control plane calls Sweep on its timer: the flows and
// half-open counts say the table is empty again rather than full until
// the next packet (packet-driven sweeps alone leave 256 flows here).
func TestFloodedTableDrainsWithoutTraffic(t *testing.T) {
	const max = 256
	r := newRig(t, testConfig(t), EngineOptions{Flows: FlowTableOptions{MaxFlows: max, Shards: 4}})
	r.synFlood(t, 256, 2*max)
	if st := r.e.Flows().Stats(); st.Flows != max || st.HalfOpen != max {
		t.Fatalf("after the flood: %+v, want the table full (%d), all half-open", st, max)
	}
	// A recompute tick (100 ms) on the manual clock, no packet.
	const tick = 100 * time.Millisecond
	var took time.Duration
	for took < 2*policy.DefaultHandshakeTimeout && r.e.Flows().Stats().Flows > 0 {
		r.clock.Advance(tick)
		took += tick
		r.e.Sweep()
	}
	st := r.e.Flows().Stats()
	t.Logf("table of %d drained %v after the flood with no packet: %+v", max, took, st)
	if st.Flows != 0 || st.HalfOpen != 0 {
		t.Fatalf("%v after the flood: %+v, want the table empty", took, st)
	}
	if took > policy.DefaultHandshakeTimeout {
		t.Errorf("the flood's flows lived %v, timeouts.handshake is %v", took, policy.DefaultHandshakeTimeout)
	}
	// Sweep is a no-op until the next sweep is due.
	before := r.e.Flows().Stats()
	r.e.Sweep()
	if after := r.e.Flows().Stats(); after != before {
		t.Errorf("a Sweep not due changed the table: %+v -> %+v", before, after)
	}
}
