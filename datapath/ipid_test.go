package datapath

import (
	"math/rand/v2"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
)

// segID is seg4 with the IPv4 identification id.
func segID(t testing.TB, src, dst net.IP, sport, dport uint16, seq uint32, n int, flags string, id uint16) []byte {
	tcp := &layers.TCP{SrcPort: layers.TCPPort(sport), DstPort: layers.TCPPort(dport), Seq: seq, Window: 65535, ACK: true}
	for _, f := range flags {
		switch f {
		case 'S':
			tcp.SYN = true
		case 'F':
			tcp.FIN = true
		}
	}
	tcp.ACK = flags != "S"
	ip := ip4(src, dst, layers.IPProtocolTCP)
	ip.Id = id
	tcp.SetNetworkLayerForChecksum(ip)
	return serialize(t, ip, tcp, gopacket.Payload(make([]byte, n)))
}

func TestParseIPID(t *testing.T) {
	var p Packet
	if r := Parse(segID(t, target4, backAddr4, 80, 1000, 1, 10, "A", 0xbeef), &p); r != DropNone || p.IPID != 0xbeef {
		t.Errorf("IPv4: %v, IPID %#x, want 0xbeef", r, p.IPID)
	}
	if r := Parse(tcp6(t, client6, vip6, 1, 2, 0, false, true, 0), &p); r != DropNone || p.IPID != 0 {
		t.Errorf("IPv6: %v, IPID %#x, want 0", r, p.IPID)
	}
}

const ms = int64(time.Millisecond)

// ids drives d with the IDs from first on, one per ms, each standing for
// one packet unless segs says otherwise; reorder window 10 ms.
func ids(d *ipidDir, list ...uint16) {
	for _, id := range list {
		d.step(id, 1, int64(id)*ms, 10*ms)
	}
}

// run returns n consecutive IDs from first.
func idRun(first uint16, n int) []uint16 {
	out := make([]uint16, n)
	for i := range out {
		out[i] = first + uint16(i)
	}
	return out
}

// TestIPIDSequential: a Linux-like flow (one ID per packet) is in force
// after idOn steps, and each gap then is a lost packet once confirmed; the
// gaps before it is in force are not counted.
func TestIPIDSequential(t *testing.T) {
	var d ipidDir
	seq := idRun(100, 40)
	// 104 missing before the signal is in force, 130..131 after it.
	list := append(append(append([]uint16{}, seq[:4]...), seq[5:30]...), seq[32:]...)
	ids(&d, list...)
	ids(&d, 200) // a foreign ID (a control socket's RST): not a loss
	ids(&d, 140, 141)
	if got := d.lost.Load(); got != 2 {
		t.Errorf("lost %d, want 2 (the gap at 130..131 only)", got)
	}
	if d.judged.Load() == 0 || d.score < idOn {
		t.Errorf("signal not in force: score %d, judged %d", d.score, d.judged.Load())
	}
}

// TestIPIDRandom: random IDs never bring the signal in force.
func TestIPIDRandom(t *testing.T) {
	var d ipidDir
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 20000 {
		d.step(uint16(r.Uint32()), 1, int64(i)*ms, 10*ms)
	}
	if d.lost.Load() != 0 || d.judged.Load() != 0 {
		t.Errorf("random IDs: lost %d, judged %d, want 0", d.lost.Load(), d.judged.Load())
	}
}

// TestIPIDGlobalCounter: a host-wide counter shared with the host's other
// flows (steps of 1 to 16 as 16 flows interleave, one in 16 exact) keeps the
// signal out of force: no gap counts as a loss.
func TestIPIDGlobalCounter(t *testing.T) {
	var d ipidDir
	r := rand.New(rand.NewPCG(3, 4))
	id := uint16(7)
	for i := range 20000 {
		id += 1 + uint16(r.IntN(16))
		d.step(id, 1, int64(i)*ms, 10*ms)
	}
	if d.lost.Load() > 0 || d.judged.Load() > 0 {
		t.Errorf("global counter: lost %d, judged %d, want 0", d.lost.Load(), d.judged.Load())
	}
}

// TestIPIDConstant: a stack that stamps every packet 0 (DF, RFC 6864) is
// never sequential.
func TestIPIDConstant(t *testing.T) {
	var d ipidDir
	for i := range 1000 {
		d.step(0, 1, int64(i)*ms, 10*ms)
	}
	if d.lost.Load() != 0 || d.judged.Load() != 0 {
		t.Errorf("constant IDs: lost %d, judged %d", d.lost.Load(), d.judged.Load())
	}
}

// TestIPIDSuperPackets: a GSO/GRO super-packet of n segments carries the
// first segment's ID and advances the counter by n: no gap.
func TestIPIDSuperPackets(t *testing.T) {
	var d ipidDir
	id := uint16(1000)
	for i := range 100 {
		segs := 1 + i%10
		d.step(id, segs, int64(i)*ms, 10*ms)
		id += uint16(segs)
	}
	if d.lost.Load() != 0 || d.judged.Load() == 0 {
		t.Errorf("super-packets: lost %d, judged %d; want 0 lost, in force", d.lost.Load(), d.judged.Load())
	}
	d.step(id+3, 1, 200*ms, 10*ms) // 3 lost
	d.step(id+4, 1, 300*ms, 10*ms)
	if d.lost.Load() != 3 {
		t.Errorf("lost %d after a gap of 3, want 3", d.lost.Load())
	}
}

// TestIPIDReorder: a packet late within the reorder window fills its gap
// (not lost); one later than the window was counted lost; a gap's middle
// filled splits it.
func TestIPIDReorder(t *testing.T) {
	var d ipidDir
	for i := range 30 {
		d.step(uint16(i), 1, 0, 10*ms)
	}
	d.step(31, 1, 1*ms, 10*ms) // 30 missing
	d.step(30, 1, 2*ms, 10*ms) // arrives 1 ms late: reordered
	d.step(36, 1, 3*ms, 10*ms) // 32..35 missing
	d.step(33, 1, 4*ms, 10*ms) // the middle of it arrives
	d.step(37, 1, 20*ms, 10*ms)
	if got := d.lost.Load(); got != 3 {
		t.Errorf("lost %d, want 3 (32, 34, 35)", got)
	}
	d.step(40, 1, 21*ms, 10*ms) // 38, 39 missing
	d.step(41, 1, 40*ms, 10*ms) // confirms them
	d.step(38, 1, 41*ms, 10*ms) // too late: already counted
	if got := d.lost.Load(); got != 5 {
		t.Errorf("lost %d, want 5", got)
	}
}

// TestIPIDWraps: the 16-bit counter wraps without a gap, and a gap across
// the wrap counts its packets.
func TestIPIDWraps(t *testing.T) {
	var d ipidDir
	ids(&d, idRun(65500, 60)...) // 65500 … 65535, 0 … 23
	if d.lost.Load() != 0 || d.judged.Load() == 0 {
		t.Fatalf("across the wrap: lost %d, judged %d", d.lost.Load(), d.judged.Load())
	}
	d = ipidDir{}
	for i, id := range idRun(65510, 26) {
		d.step(id, 1, int64(i)*ms, 0)
	}
	d.step(2, 1, 30*ms, 0) // 0 and 1 of the next round missing (65510+26 wraps to 0)
	if got := d.lost.Load(); got != 2 {
		t.Errorf("lost %d across the wrap, want 2", got)
	}
}

// TestIPIDJump: a counter that jumps (many packets lost at once, or a
// restart) is followed after two packets in step with each other.
func TestIPIDJump(t *testing.T) {
	var d ipidDir
	ids(&d, idRun(10, 30)...)
	for i, id := range idRun(30000, 30) {
		d.step(id, 1, int64(100+i)*ms, 10*ms)
	}
	d.step(30000+30+1, 1, 200*ms, 10*ms) // one lost after the jump
	d.step(30000+30+2, 1, 300*ms, 10*ms)
	if got := d.lost.Load(); got != 1 || d.next != 30033 {
		t.Errorf("after a jump: lost %d, next %d; want 1, 30033", got, d.next)
	}
}

// TestSegStatsIPIDWithSequence drives a back leg's SegStats with the
// target's packets and checks the combined rule: a tail loss (the resend is
// the first copy) counts once by its ID gap; a mid-stream loss the sequence
// rule sees resent counts once, not twice; a spurious resend (no gap) counts
// once by the sequence rule; IPv6 and random IDs keep the sequence rule
// alone.
func TestSegStatsIPIDWithSequence(t *testing.T) {
	const lport, tport = 41000, 8080
	type pkt struct {
		seq   uint32
		n     int
		id    uint16
		at    int64 // ms
		flags string
	}
	drive := func(pkts []pkt) SegCounters {
		var s SegStats
		atomicRTT := int64(2 * ms)
		s.rtt.Store(atomicRTT) // reorder window 1 ms
		var pk Packet
		for _, p := range pkts {
			b := segID(t, target4, backAddr4, tport, lport, p.seq, p.n, p.flags, p.id)
			if Parse(b, &pk) != DropNone {
				t.Fatal("parse")
			}
			s.ingress(b, &pk, 1, p.at*ms, int64(200*time.Millisecond))
		}
		return s.FromTarget()
	}
	// 20 one-segment responses of 100 bytes, one per 10 ms, IDs from 500.
	base := func() []pkt {
		var ps []pkt
		for i := range 20 {
			ps = append(ps, pkt{seq: 1 + uint32(100*i), n: 100, id: 500 + uint16(i), at: int64(10 * i), flags: "A"})
		}
		return ps
	}
	check := func(name string, c SegCounters, data, lost uint64) {
		t.Helper()
		if d, l := c.Loss(); d != data || l != lost {
			t.Errorf("%s: Loss() = %d data, %d lost; want %d, %d (%+v)", name, d, l, data, lost, c)
		}
	}

	// Tail loss: response 20 (seq 2001, ID 520) lost, its probe (ID 521)
	// is the first copy weir sees, then the next response (ID 522).
	ps := append(base(), pkt{2001, 100, 521, 215, "A"}, pkt{2101, 100, 522, 230, "A"})
	c := drive(ps)
	if c.Retransmitted != 0 || c.IPIDLost != 1 {
		t.Errorf("tail loss: sequence %d retransmitted, IP ID %d lost; want 0, 1", c.Retransmitted, c.IPIDLost)
	}
	check("tail loss", c, 23, 1)

	// Mid-stream loss: seq 2001 (ID 520) lost, 2101 (ID 521) arrives,
	// then the repair of 2001 (ID 522) 5 ms later.
	ps = append(base(), pkt{2101, 100, 521, 200, "A"}, pkt{2001, 100, 522, 205, "A"}, pkt{2201, 100, 523, 210, "A"})
	c = drive(ps)
	if c.Retransmitted != 1 || c.IPIDLost != 1 || c.IPIDMatched != 1 {
		t.Errorf("mid-stream loss: %+v, want 1 retransmitted, 1 lost, 1 matched", c)
	}
	check("mid-stream loss", c, 24, 1)

	// A spurious resend of seq 1901 (no ID missing).
	ps = append(base(), pkt{1901, 100, 520, 200, "A"})
	check("spurious resend", drive(ps), 21, 1)

	// A lost pure ACK (ID 520) counts as a lost packet too.
	ps = append(base(), pkt{2001, 100, 521, 200, "A"}, pkt{2101, 100, 522, 210, "A"})
	check("lost ACK", drive(ps), 23, 1)

	// Random IDs: the tail loss stays invisible.
	r := rand.New(rand.NewPCG(5, 6))
	ps = append(base(), pkt{2001, 100, 521, 215, "A"}, pkt{2101, 100, 522, 230, "A"})
	for i := range ps {
		ps[i].id = uint16(r.Uint32())
	}
	if c := drive(ps); c.IPIDPackets != 0 {
		t.Errorf("random IDs judged: %+v", c)
	} else {
		check("random IDs", c, 22, 0)
	}
}

// TestEngineIPIDTailLoss runs the tail-loss case through the engine: the
// back leg's FromTarget counts the lost response the sequence rule cannot
// see, and the path stays allocation-free.
func TestEngineIPIDTailLoss(t *testing.T) {
	r := newRig(t, testConfig(t), EngineOptions{BackPrefixes: []netip.Prefix{backPrefix4}})
	const lport, tport = 41000, 8080
	r.clock.Advance(time.Millisecond)
	r.egress(t, seg4(t, backAddr4, target4, lport, tport, 999, 0, "S"))
	r.clock.Advance(2 * time.Millisecond)
	r.ingress(t, segID(t, target4, backAddr4, tport, lport, 4999, 0, "SA", 0)) // SYN-ACK, ID 0
	id, seq := uint16(65530), uint32(5000)
	for range 30 {
		r.clock.Advance(10 * time.Millisecond)
		r.egress(t, seg4(t, backAddr4, target4, lport, tport, 1000, 0, "A"))
		r.ingress(t, segID(t, target4, backAddr4, tport, lport, seq, 200, "A", id))
		id++
		seq += 200
	}
	id++ // the next response lost; its probe is the first copy
	r.clock.Advance(20 * time.Millisecond)
	r.ingress(t, segID(t, target4, backAddr4, tport, lport, seq, 200, "A", id))
	r.clock.Advance(10 * time.Millisecond)
	r.ingress(t, segID(t, target4, backAddr4, tport, lport, seq+200, 200, "A", id+1))
	s := r.e.Segments(netip.MustParseAddrPort("198.19.255.1:41000"), netip.MustParseAddrPort("198.18.7.2:8080"))
	c := s.FromTarget()
	if data, lost := c.Loss(); c.Retransmitted != 0 || lost != 1 || data != 33 || c.IPIDPackets == 0 {
		t.Errorf("tail loss through the engine: %+v (Loss %d of %d), want 1 lost of 33", c, lost, data)
	}
	if to := s.ToTarget(); to.IPIDPackets != 0 {
		t.Errorf("to_target judged by IP ID: %+v", to)
	}
}
