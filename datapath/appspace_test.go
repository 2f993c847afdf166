package datapath

import (
	"net/netip"
	"testing"

	"weir/policy"
)

// TestEngineAppBytesOnce is N5: a 1000-byte segment toward a client resent
// once counts 1000 application bytes (bandwidthBytes: payload) and both
// copies on the wire (bandwidthBytes: wire: 2 × 1040). The same from the
// client: the resend of a segment weir already saw counts nothing, the
// repair of one lost before weir (a hole) counts once.
func TestEngineAppBytesOnce(t *testing.T) {
	for _, count := range []policy.ByteCount{policy.CountPayload, policy.CountWire} {
		t.Run(count.String(), func(t *testing.T) {
			cfg := testConfig(t)
			cfg.Instance.BandwidthBytes = count
			r := newRig(t, cfg, EngineOptions{})
			const cport = 40000
			r.ingress(t, seg4(t, client4, vip4, cport, 80, 999, 0, "S"))
			client, server := netip.MustParseAddrPort("198.18.0.2:40000"), netip.MustParseAddrPort("198.18.0.1:80")
			id := r.e.Meters().TargetID(0, 1)
			r.e.Flow(client, server, ProtoTCP).Bind(id)
			r.egress(t, seg4(t, vip4, client4, 80, cport, 4999, 0, "SA"))
			r.egress(t, seg4(t, vip4, client4, 80, cport, 5000, 1000, "A"))
			r.egress(t, seg4(t, vip4, client4, 80, cport, 5000, 1000, "A")) // resent
			pay, wire := r.e.Meters().TargetPayload(id), r.targetWire(id)
			if pay[Egress].Bytes != 1000 || wire[Egress].Bytes != 40+2*1040 {
				t.Errorf("toward the client: %d application bytes, %d on the wire; want 1000, %d", pay[Egress].Bytes, wire[Egress].Bytes, 40+2*1040)
			}
			n, _ := r.e.ServiceBytes("www")
			if want := map[policy.ByteCount]uint64{policy.CountPayload: 1000, policy.CountWire: 40 + 2*1040}[count]; n != want {
				t.Errorf("ServiceBytes %d, want %d", n, want)
			}

			// From the client: 1000..1999 seen, 2000..2999 lost before weir,
			// 3000..3999 seen; then 2000 repaired (counts) and 1000 resent
			// (does not).
			for _, seq := range []uint32{1000, 3000, 2000, 1000} {
				r.ingress(t, seg4(t, client4, vip4, cport, 80, seq, 1000, "A"))
			}
			if pay := r.e.Meters().TargetPayload(id); pay[Ingress].Bytes != 3000 || pay[Ingress].Packets != 4 {
				t.Errorf("from the client: %d application bytes in %d packets, want 3000 in 4", pay[Ingress].Bytes, pay[Ingress].Packets)
			}
			if wire := r.targetWire(id); wire[Ingress].Bytes != 4*1040 {
				t.Errorf("from the client on the wire: %d, want %d", wire[Ingress].Bytes, 4*1040)
			}
		})
	}
}

// targetWire returns target id's wire row.
func (r *engineRig) targetWire(id int) Traffic {
	var tot MeterTotals
	r.e.Meters().Totals(&tot)
	return tot.Targets[id]
}

// TestAppSpace drives one direction's count with crafted segments.
func TestAppSpace(t *testing.T) {
	type s struct {
		seq   uint32
		n     int
		flags uint8
		want  int
	}
	for _, tc := range []struct {
		name string
		segs []s
	}{
		{"in order", []s{{99, 0, TCPSyn, 0}, {100, 500, TCPAck, 500}, {600, 500, TCPAck, 500}}},
		{"resend counts nothing", []s{{99, 0, TCPSyn, 0}, {100, 500, TCPAck, 500}, {100, 500, TCPAck, 0}}},
		{"partial resend counts the new part", []s{{99, 0, TCPSyn, 0}, {100, 500, TCPAck, 500}, {300, 500, TCPAck, 200}}},
		{"hole filled counts once", []s{{99, 0, TCPSyn, 0}, {100, 100, TCPAck, 100}, {300, 100, TCPAck, 100},
			{200, 100, TCPAck, 100}, {200, 100, TCPAck, 0}}},
		{"keepalive", []s{{99, 0, TCPSyn, 0}, {100, 100, TCPAck, 100}, {199, 1, TCPAck, 0}}},
		{"first seen mid-stream", []s{{7000, 100, TCPAck, 100}, {7000, 100, TCPAck, 0}, {7100, 10, TCPAck, 10}}},
		{"wraps", []s{{0xffffff00, 0, TCPSyn, 0}, {0xffffff01, 0x100, TCPAck, 0x100}, {1, 100, TCPAck, 100}, {0xffffff01, 0x100, TCPAck, 0}}},
		// A forged segment far ahead opens a 1 GB hole: later segments
		// count their own bytes, never the hole's size.
		{"forged jump", []s{{99, 0, TCPSyn, 0}, {100 + 1<<30, 10, TCPAck, 10}, {100, 500, TCPAck, 500}, {100, 500, TCPAck, 500}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var a appSpace
			for i, g := range tc.segs {
				if got := a.count(g.seq, g.n, g.flags); got != g.want {
					t.Errorf("segment %d (seq %d, %d bytes): %d, want %d", i, g.seq, g.n, got, g.want)
				}
			}
		})
	}
}

// TestEngineBoundFlowsZeroAllocs: the application byte count of flows
// bound to a target adds no allocation to the per-batch path.
func TestEngineBoundFlowsZeroAllocs(t *testing.T) {
	eg, in := pathPackets(t, false, 64)
	e := NewEngine(&sinkDevice{pkts: in}, testConfig(t), EngineOptions{})
	bufs, sizes := makeBatch(64, 1500, 0), make([]int, 64)
	e.Read(bufs, sizes, 0) // create the flows
	id := e.Meters().TargetID(0, 1)
	var pk Packet
	for _, b := range in {
		if Parse(b, &pk) != DropNone {
			t.Fatal("parse")
		}
		e.Flow(pk.SrcAddrPort(), pk.DstAddrPort(), ProtoTCP).Bind(id)
	}
	allocs := testing.AllocsPerRun(100, func() {
		e.Read(bufs, sizes, 0)
		e.Write(eg, 0)
	})
	if allocs != 0 {
		t.Errorf("bound flows: per-batch path allocates %.1f times, want 0", allocs)
	}
	if tp := e.Meters().TargetPayload(id); tp[Ingress].Packets == 0 {
		t.Error("nothing counted for the target")
	}
}
