package datapath

import (
	"encoding/binary"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
)

var (
	backAddr4   = net.IP{198, 19, 255, 1}
	target4     = net.IP{198, 18, 7, 2}
	backPrefix4 = netip.MustParsePrefix("198.19.255.1/32")
)

// seg4 is a TCP segment src:sport → dst:dport with sequence number seq and
// n payload bytes; flags "S", "SA", "A" or "F".
func seg4(t testing.TB, src, dst net.IP, sport, dport uint16, seq uint32, n int, flags string) []byte {
	tcp := &layers.TCP{SrcPort: layers.TCPPort(sport), DstPort: layers.TCPPort(dport), Seq: seq, Window: 65535}
	for _, f := range flags {
		switch f {
		case 'S':
			tcp.SYN = true
		case 'A':
			tcp.ACK = true
		case 'F':
			tcp.FIN = true
		}
	}
	ip := ip4(src, dst, layers.IPProtocolTCP)
	tcp.SetNetworkLayerForChecksum(ip)
	return serialize(t, ip, tcp, gopacket.Payload(make([]byte, n)))
}

// TestSeqDir drives one direction with crafted sequences (seq, len, arrival
// ms) and checks each judgement: retransmission, reordering, out of order,
// timeout, keepalive.
func TestSeqDir(t *testing.T) {
	const ms = int64(time.Millisecond)
	type s struct {
		seq uint32
		n   int
		at  int64 // ms
	}
	tests := []struct {
		name string
		segs []s
		want SegCounters
	}{
		{"in order", []s{{1, 100, 0}, {101, 100, 1}, {201, 100, 2}}, SegCounters{DataSegments: 3}},
		{"duplicate is a retransmission", []s{{1, 100, 0}, {101, 100, 1}, {1, 100, 2}},
			SegCounters{DataSegments: 3, Retransmitted: 1}},
		{"lost then repaired late", []s{{1, 100, 0}, {201, 100, 1}, {301, 100, 2}, {101, 100, 20}},
			SegCounters{DataSegments: 4, Retransmitted: 1, OutOfOrder: 2}},
		{"reordered within the window", []s{{1, 100, 0}, {201, 100, 1}, {101, 100, 2}},
			SegCounters{DataSegments: 3, OutOfOrder: 1}},
		{"repair after a silence over the RTO is a timeout", []s{{1, 100, 0}, {201, 100, 1}, {101, 100, 500}},
			SegCounters{DataSegments: 3, Retransmitted: 1, Timeouts: 1, OutOfOrder: 1}},
		{"new data after a silence is no timeout", []s{{1, 100, 0}, {101, 100, 900}}, SegCounters{DataSegments: 2}},
		{"keepalive is not data", []s{{1, 100, 0}, {100, 1, 300}, {100, 0, 600}}, SegCounters{DataSegments: 1}},
		{"two holes, filled in turn", []s{{1, 100, 0}, {201, 100, 1}, {401, 100, 2}, {101, 100, 30}, {301, 100, 31}},
			SegCounters{DataSegments: 5, Retransmitted: 2, OutOfOrder: 2}},
		{"partial fill splits a hole", []s{{1, 100, 0}, {401, 100, 1}, {201, 100, 30}, {101, 100, 40}, {301, 100, 41}, {201, 100, 42}},
			SegCounters{DataSegments: 6, Retransmitted: 4, OutOfOrder: 2}},
		// weir's request toward a target (to_target during downloads: one
		// data segment per connection), lost twice: a tail-loss probe
		// after 15 ms, then its RTO. Each resend counts: the e2e test
		// finds exactly nftables' drops.
		{"a lone request resent twice", []s{{1, 60, 0}, {1, 60, 15}, {1, 60, 400}},
			SegCounters{DataSegments: 3, Retransmitted: 2, Timeouts: 1}},
		{"sequence wraps", []s{{0xffffff00, 0x100, 0}, {0x100, 100, 1}, {0, 0x100, 30}},
			SegCounters{DataSegments: 3, Retransmitted: 1, OutOfOrder: 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var d seqDir
			// The SYN (ISN one below the first data byte) at t=0; reorder
			// window 10 ms, RTO estimate 200 ms.
			d.observe(tt.segs[0].seq-1, 0, 1, TCPSyn, 0, 200*ms, 10*ms)
			for _, g := range tt.segs {
				d.observe(g.seq, g.n, 1, TCPAck, g.at*ms, 200*ms, 10*ms)
			}
			if got := d.counters(); got != tt.want {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

// TestSeqDirManyHoles opens more holes than are tracked: every later fill
// still counts as a retransmission.
func TestSeqDirManyHoles(t *testing.T) {
	var d seqDir
	d.observe(0, 0, 1, TCPSyn, 0, 1e9, 0)
	seq := uint32(1)
	for i := 0; i < 10; i++ { // segments 0,2,4,…: 9 holes
		d.observe(seq, 100, 1, TCPAck, int64(i), 1e9, 0)
		seq += 200
	}
	for i := 0; i < 9; i++ {
		d.observe(uint32(101+200*i), 100, 1, TCPAck, int64(20+i), 1e9, 0)
	}
	if got := d.counters().Retransmitted; got != 9 {
		t.Errorf("retransmitted %d, want 9", got)
	}
}

// TestEngineMeasuresBackLeg sends a crafted back-leg exchange through the
// engine: weir's SYN out, the target's SYN-ACK and data in (one segment
// lost and repaired, one repeated), weir's data out with one resent. Only
// the back leg is measured; a client flow gets no SegStats.
func TestEngineMeasuresBackLeg(t *testing.T) {
	r := newRig(t, testConfig(t), EngineOptions{BackPrefixes: []netip.Prefix{backPrefix4}})
	clk := r.clock
	const lport, tport = 41000, 8080
	out := func(seq uint32, n int, flags string) {
		r.egress(t, seg4(t, backAddr4, target4, lport, tport, seq, n, flags))
	}
	in := func(seq uint32, n int, flags string) {
		r.ingress(t, seg4(t, target4, backAddr4, tport, lport, seq, n, flags))
	}
	clk.Advance(time.Millisecond)
	out(999, 0, "S")
	clk.Advance(2 * time.Millisecond)
	in(4999, 0, "SA")
	out(1000, 10, "A")
	in(5000, 1000, "A")
	clk.Advance(time.Millisecond)
	in(7000, 1000, "A") // 6000 was lost
	clk.Advance(5 * time.Millisecond)
	in(6000, 1000, "A") // repaired 5 ms later: past the 1 ms reorder window
	in(7000, 1000, "A") // repeated
	out(1000, 10, "A")  // weir resends
	s := r.e.Segments(netip.MustParseAddrPort("198.19.255.1:41000"), netip.MustParseAddrPort("198.18.7.2:8080"))
	if s == nil {
		t.Fatal("no SegStats for the back leg")
	}
	if got := s.RTT(); got != 2*time.Millisecond {
		t.Errorf("handshake RTT %v, want 2ms", got)
	}
	if got, want := s.FromTarget(), (SegCounters{DataSegments: 4, Retransmitted: 2, OutOfOrder: 1}); got != want {
		t.Errorf("from target %+v, want %+v", got, want)
	}
	if got, want := s.ToTarget(), (SegCounters{DataSegments: 2, Retransmitted: 1}); got != want {
		t.Errorf("to target %+v, want %+v", got, want)
	}
	r.ingress(t, tcp4(t, client4, vip4, 40000, 80, 0, true, false, 0))
	if f := r.e.Flow(netip.MustParseAddrPort("198.18.0.2:40000"), netip.MustParseAddrPort("198.18.0.1:80"), ProtoTCP); f == nil || f.Seg() != nil {
		t.Errorf("client flow %v: want a flow without SegStats", f)
	}
	// A config swap replaces the Flow; the measurement carries over.
	r.e.SetConfig(testConfig(t))
	in(8000, 1000, "A")
	if got := r.e.Segments(netip.MustParseAddrPort("198.19.255.1:41000"), netip.MustParseAddrPort("198.18.7.2:8080")).FromTarget().DataSegments; got != 5 {
		t.Errorf("after a swap: %d data segments, want 5", got)
	}
}

// TestEngineBackLegZeroAllocs pins the measured back-leg path at zero
// allocations per batch.
func TestEngineBackLegZeroAllocs(t *testing.T) {
	eg, in := backPackets(t, 64)
	e := NewEngine(&sinkDevice{pkts: in}, testConfig(t), EngineOptions{BackPrefixes: []netip.Prefix{backPrefix4}})
	e.Write(eg, 0)
	bufs, sizes := makeBatch(64, 1500, 0), make([]int, 64)
	allocs := testing.AllocsPerRun(100, func() {
		e.Read(bufs, sizes, 0)
		e.Write(eg, 0)
	})
	if allocs != 0 {
		t.Errorf("back-leg path allocates %.1f times per batch, want 0", allocs)
	}
	if e.Segments(netip.MustParseAddrPort("198.19.255.1:20000"), netip.MustParseAddrPort("198.18.7.2:8080")).FromTarget().DataSegments == 0 {
		t.Error("nothing measured")
	}
}

// backPackets returns n egress data segments of n back-leg flows and the
// target's matching data segments.
func backPackets(t testing.TB, n int) (egress, ingress [][]byte) {
	for i := range n {
		port := uint16(20000 + i)
		egress = append(egress, seg4(t, backAddr4, target4, port, 8080, 1, 100, "A"))
		ingress = append(ingress, seg4(t, target4, backAddr4, 8080, port, 1, 1000, "A"))
	}
	return egress, ingress
}

// BenchmarkBackLeg measures the per-packet cost of the passive measurement:
// the same back-leg packets through an engine without BackPrefixes (plain)
// and with them (measured), in one run. One op is one packet.
func BenchmarkBackLeg(b *testing.B) {
	eg, in := backPackets(b, 64)
	cfg := testConfig(b)
	for _, measured := range []bool{false, true} {
		name := "plain"
		var o EngineOptions
		if measured {
			name, o.BackPrefixes = "measured", []netip.Prefix{backPrefix4}
		}
		b.Run(name+"/ingress", func(b *testing.B) {
			e := NewEngine(&sinkDevice{pkts: in}, cfg, o)
			bufs, sizes := makeBatch(64, 1500, 0), make([]int, 64)
			e.Read(bufs, sizes, 0)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i += 64 {
				e.Read(bufs, sizes, 0)
			}
		})
		b.Run(name+"/egress", func(b *testing.B) {
			e := NewEngine(&sinkDevice{}, cfg, o)
			e.Write(eg, 0)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i += 64 {
				e.Write(eg, 0)
			}
		})
	}
}

// TestSeqDirSuperPackets: a GSO/GRO super-packet counts as the wire
// segments it stands for, so the ratio is the same with offload on and off:
// a 10-segment super-packet, a segment past a hole and the hole resent
// read 1 retransmitted in 12, not 1 in 3.
func TestSeqDirSuperPackets(t *testing.T) {
	var d seqDir
	d.observe(0, 0, 1, TCPSyn, 0, 1e9, 0)
	d.observe(1, 1000, 10, TCPAck, 1, 1e9, 0)   // bytes 1..1000 as 10 segments
	d.observe(1101, 100, 1, TCPAck, 2, 1e9, 0)  // a hole 1001..1100 before it
	d.observe(1001, 100, 1, TCPAck, 30, 1e9, 0) // the hole filled late: resent
	want := SegCounters{DataSegments: 12, Retransmitted: 1, OutOfOrder: 1}
	if got := d.counters(); got != want {
		t.Errorf("got %+v, want %+v", got, want)
	}
	// A resent super-packet counts each of its segments.
	d.observe(1, 1000, 10, TCPAck, 40, 1e9, 0)
	if got := d.counters(); got.Retransmitted != 11 || got.DataSegments != 22 {
		t.Errorf("after a resent 10-segment super-packet: %+v, want 11 retransmitted of 22", got)
	}
}

// TestUnacked follows weir's bytes toward a target against the target's
// acknowledgements: what it sent and the target has not acknowledged,
// never less than 0, an old ACK no step back, across the wrap.
func TestUnacked(t *testing.T) {
	r := newRig(t, testConfig(t), EngineOptions{BackPrefixes: []netip.Prefix{backPrefix4}})
	const lport, tport = 41001, 8080
	isn := uint32(0xffffff00) // the data crosses 2³²
	const mss = 1000
	out := func(seq uint32, n int, flags string) {
		r.egress(t, seg4(t, backAddr4, target4, lport, tport, seq, n, flags))
	}
	in := func(ack uint32) {
		r.ingress(t, seg4ack(t, target4, backAddr4, tport, lport, 5000, ack, 0, "A"))
	}
	seg := func() *SegStats {
		return r.e.Segments(netip.MustParseAddrPort("198.19.255.1:41001"), netip.MustParseAddrPort("198.18.7.2:8080"))
	}
	out(isn, 0, "S")
	if got := seg().Unacked(); got != 0 {
		t.Errorf("before the target's first ACK: %d, want 0 (unknown)", got)
	}
	r.ingress(t, seg4ack(t, target4, backAddr4, tport, lport, 4999, isn+1, 0, "SA"))
	for _, step := range []struct {
		name string
		do   func()
		want uint32
	}{
		{"handshake done", func() {}, 0},
		{"a request head out", func() { out(isn+1, 200, "A") }, 200},
		{"acknowledged", func() { in(isn + 201) }, 0},
		{"a body of three segments out", func() {
			for i := range uint32(3) {
				out(isn+201+i*mss, mss, "A")
			}
		}, 3 * mss},
		{"the first acknowledged, past the wrap", func() { in(isn + 201 + mss) }, 2 * mss},
		{"an old ACK is no step back", func() { in(isn + 201) }, 2 * mss},
		{"a resend adds nothing", func() { out(isn+201+mss, mss, "A") }, 2 * mss},
		{"all acknowledged", func() { in(isn + 201 + 3*mss) }, 0},
	} {
		step.do()
		if got := seg().Unacked(); got != step.want {
			t.Errorf("%s: Unacked %d, want %d", step.name, got, step.want)
		}
	}
}

// seg4ack is seg4 with an acknowledgement number.
func seg4ack(t testing.TB, src, dst net.IP, sport, dport uint16, seq, ack uint32, n int, flags string) []byte {
	b := seg4(t, src, dst, sport, dport, seq, n, flags)
	ihl := int(b[0]&0x0f) * 4
	binary.BigEndian.PutUint32(b[ihl+8:], ack)
	// The checksum is not the engine's concern here; keep it consistent
	// anyway: recompute over the pseudo-header.
	binary.BigEndian.PutUint16(b[ihl+16:], 0)
	binary.BigEndian.PutUint16(b[ihl+16:], tcpChecksum4(b[12:16], b[16:20], b[ihl:]))
	return b
}

// tcpChecksum4 is the TCP checksum of seg between IPv4 src and dst.
func tcpChecksum4(src, dst, seg []byte) uint16 {
	var sum uint32
	add := func(b []byte) {
		for i := 0; i+1 < len(b); i += 2 {
			sum += uint32(b[i])<<8 | uint32(b[i+1])
		}
		if len(b)%2 == 1 {
			sum += uint32(b[len(b)-1]) << 8
		}
	}
	add(src)
	add(dst)
	sum += 6 + uint32(len(seg))
	add(seg)
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}
