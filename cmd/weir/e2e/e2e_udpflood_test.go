//go:build linux

package e2e

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"weir/cmd/weir/api"
	"weir/internal/testutil"
)

const (
	// udpFloodDatagrams and udpFloodRate bound TestE2EUDPFlood's flood: 20 000
	// datagrams from as many spoofed sources, 10 000 a second (2 s).
	udpFloodDatagrams = 20000
	udpFloodRate      = 10000
	// udpFloodMaxSessions is udpflood.yaml's udp.maxSessions of the
	// flooded VIP.
	udpFloodMaxSessions = 256
	// udpFloodRSS bounds weir's peak resident set (VmHWM) over the whole
	// test; udpFloodGrowth bounds what the flood adds to it.
	udpFloodRSS    = 192 << 20
	udpFloodGrowth = 48 << 20
)

// TestE2EUDPFlood: a spoofed UDP flood (udpFloodDatagrams DNS queries, each
// from its own source in 198.19.0.0/16, written through a raw socket in
// weir's namespace so that they enter weir through its TUN) at one udp VIP
// whose udp.maxSessions is 256, while real DNS clients (Go sockets, a new
// source port and so a new session per query) query a second VIP through
// it. ≥ 99 % of the real queries are answered; the flooded VIP holds
// exactly 256 sessions (its first sources'), and every other flood
// datagram is accounted for by a drop counter: the relay's (its VIP bound
// full, the table full) or one before it (the TUN's kernel queue, the
// datapath, the NIC, the VIP endpoint's receive buffer), none unaccounted;
// weir's peak RSS (VmHWM) stays under udpFloodRSS and grows by less than
// udpFloodGrowth. The figures are logged.
func TestE2EUDPFlood(t *testing.T) {
	w := startWeir(t, "udpflood.yaml")
	w.dnsmasq("198.18.9.1", "198.18.1.1")
	w.dnsmasq("198.18.9.2", "198.18.1.2")
	const calm = "198.18.0.61:53"
	flooded := netip.MustParseAddrPort("198.18.0.60:53")
	if ok, _ := w.dnsBurst(calm, 20, 4); ok != 20 {
		t.Fatalf("before the flood: %d of 20 queries answered", ok)
	}
	pid := w.pid()
	rss0 := vmRSS(t, pid)
	st0, m0 := w.status(), w.metrics()

	var sent atomic.Int64
	floodDone := make(chan error, 1)
	floodStart := time.Now()
	go func() { floodDone <- w.udpFlood(flooded, udpFloodDatagrams, udpFloodRate, &sent) }()

	// Real queries in bursts of 64, 8 at a time, until the flood is over
	// (and 512 at least); bounded by a minute.
	const burst, workers, minQueries = 64, 8, 512
	var asked, answered int
	var floodLen time.Duration
	flooding := true
	deadline := time.Now().Add(time.Minute)
	for flooding || asked < minQueries {
		ok, _ := w.dnsBurstWait(calm, burst, workers, 2*time.Second)
		asked += burst
		answered += ok
		if flooding {
			select {
			case err := <-floodDone:
				if err != nil {
					t.Fatalf("flood: %v", err)
				}
				flooding, floodLen = false, time.Since(floodStart)
			default:
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("after a minute: the flood not over (%d sent) or fewer than %d queries (%d)", sent.Load(), minQueries, asked)
		}
	}
	lost := asked - answered

	// Every flood datagram reaches a counter: wait for them to add up (a
	// datagram may still be on its way through weir when the flood ends).
	n := sent.Load()
	var acc udpFloodAccount
	settled := testutil.WithinEvery(10*time.Second, 50*time.Millisecond, func() bool {
		acc = w.udpFloodAccount(st0, m0)
		return acc.total() >= uint64(n)
	})
	hwm := vmHWM(t, pid)
	st := w.status()

	t.Logf("flood: %d spoofed datagrams in %v (%.0f/s); real queries at the other VIP meanwhile: %d of %d answered (%.2f %%)",
		n, floodLen.Round(time.Millisecond), float64(n)/floodLen.Seconds(), answered, asked, 100*float64(answered)/float64(asked))
	t.Logf("flood accounted: %d sessions (udp.maxSessions %d), relay drops %d at the VIP bound + %d table full + %d refused; before the relay: %d TUN kernel queue, %d datapath, %d NIC, %d VIP endpoint receive buffer; %d of %d accounted",
		acc.sessions, udpFloodMaxSessions, acc.droppedVIP, acc.droppedFull, acc.refused, acc.tun, acc.datapath, acc.nic, acc.receive, acc.total(), n)
	t.Logf("weir RSS %.1f MiB before the flood, peak (VmHWM) %.1f MiB (bound %d MiB, growth bound %d MiB); udp sessions open %d, %d real sessions at the other VIP",
		float64(rss0)/(1<<20), float64(hwm)/(1<<20), udpFloodRSS>>20, udpFloodGrowth>>20, st.UDP.Sessions, acc.realSessions)

	if answered*100 < asked*99 {
		t.Errorf("%d of %d real queries unanswered under the flood, want ≤ 1 %%", lost, asked)
	}
	if acc.sessions != udpFloodMaxSessions {
		t.Errorf("the flooded VIP made %d sessions, want its udp.maxSessions %d", acc.sessions, udpFloodMaxSessions)
	}
	// The counters add up to the flood, over by at most the real queries
	// lost (a query dropped before the relay counts in the same drops).
	if !settled || acc.total() > uint64(n)+uint64(lost) {
		t.Errorf("%d flood datagrams sent, %d accounted (%+v; %d real queries lost)", n, acc.total(), acc, lost)
	}
	// The relay's bound, not a queue before it, is what stops the flood.
	if beyond := uint64(n) - udpFloodMaxSessions; acc.droppedVIP+acc.droppedFull < beyond/2 {
		t.Errorf("the relay dropped %d of the %d flood datagrams beyond the bound", acc.droppedVIP+acc.droppedFull, beyond)
	}
	if hwm > udpFloodRSS || hwm-rss0 > udpFloodGrowth {
		t.Errorf("weir's peak RSS %.1f MiB (%.1f before the flood): above %d MiB or grown by more than %d MiB",
			float64(hwm)/(1<<20), float64(rss0)/(1<<20), udpFloodRSS>>20, udpFloodGrowth>>20)
	}
}

// udpFloodAccount is where a flood's datagrams went, counted by weir since
// the flood began.
type udpFloodAccount struct {
	sessions                    uint64 // the flooded service's sessions (its target's picks)
	droppedVIP, droppedFull     uint64 // the relay's bounds
	refused                     uint64 // admission refused the session
	tun, datapath, nic, receive uint64 // before the relay
	realSessions                uint64 // the calm service's sessions: not in total
}

func (a udpFloodAccount) total() uint64 {
	return a.sessions + a.droppedVIP + a.droppedFull + a.refused + a.tun + a.datapath + a.nic + a.receive
}

// udpFloodAccount reads the counters of a udpFloodAccount now, less their
// values in st0 and m0 (before the flood).
func (w *weirProc) udpFloodAccount(st0 api.Status, m0 map[string]*metricFamily) udpFloodAccount {
	w.t.Helper()
	st, m := w.status(), w.metrics()
	p0, _ := pickedSum(st0, "flooded")
	p1, _ := pickedSum(st, "flooded")
	c0, _ := pickedSum(st0, "calm")
	c1, _ := pickedSum(st, "calm")
	delta := func(name string) uint64 {
		return uint64(max(metricSum(m, name, nil), 0) - max(metricSum(m0, name, nil), 0))
	}
	return udpFloodAccount{
		sessions:   p1 - p0,
		droppedVIP: st.UDP.DroppedVIP - st0.UDP.DroppedVIP, droppedFull: st.UDP.DroppedFull - st0.UDP.DroppedFull,
		refused: st.UDP.Refused - st0.UDP.Refused,
		tun:     delta("weir_tun_kernel_dropped_total"), datapath: delta("weir_datapath_dropped_total"),
		nic: delta("weir_nic_dropped_total"), receive: st.UDP.ReceiveDropped - st0.UDP.ReceiveDropped,
		realSessions: c1 - c0,
	}
}

// vmHWM is a process's peak resident set in bytes.
func vmHWM(t *testing.T, pid int) int64 {
	t.Helper()
	var kb int64
	fmt.Sscanf(procStatus(t, fmt.Sprintf("/proc/%d/status", pid))["VmHWM"], "%d kB", &kb)
	return kb << 10
}

// udpFlood writes count spoofed DNS queries to dst through a raw socket in
// weir's namespace, rate a second in batches every 10 ms: the i-th from
// 198.19.(i>>8).(i&255), port 1024 + i%60000 (a new source each, so a new
// session each until the bounds). What weir sends back to them dies in the
// namespace, which does not forward.
func (w *weirProc) udpFlood(dst netip.AddrPort, count, rate int, sent *atomic.Int64) error {
	// A query for who.test, A.
	q := []byte{0, 0, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0, 3, 'w', 'h', 'o', 4, 't', 'e', 's', 't', 0, 0, 1, 0, 1}
	pkt := make([]byte, 28+len(q))
	return w.rawFlood(dst, count, rate, sent, func(i int) []byte {
		binary.BigEndian.PutUint16(q, uint16(i))
		spoofedUDP(pkt, [4]byte{198, 19, byte(i >> 8), byte(i)}, uint16(1024+i%60000), dst, q)
		return pkt
	})
}

// spoofedUDP writes an IPv4 UDP datagram from src:sport to dst carrying
// payload into pkt (28 + len(payload) bytes), checksums included.
func spoofedUDP(pkt []byte, src [4]byte, sport uint16, dst netip.AddrPort, payload []byte) {
	clear(pkt)
	d := dst.Addr().As4()
	ulen := 8 + len(payload)
	pkt[0] = 0x45
	binary.BigEndian.PutUint16(pkt[2:], uint16(20+ulen))
	pkt[8] = 64 // TTL
	pkt[9] = unix.IPPROTO_UDP
	copy(pkt[12:16], src[:])
	copy(pkt[16:20], d[:])
	binary.BigEndian.PutUint16(pkt[10:], ^csum(0, pkt[:20]))
	udp := pkt[20:]
	binary.BigEndian.PutUint16(udp[0:], sport)
	binary.BigEndian.PutUint16(udp[2:], dst.Port())
	binary.BigEndian.PutUint16(udp[4:], uint16(ulen))
	copy(udp[8:], payload)
	var pseudo [12]byte
	copy(pseudo[0:4], src[:])
	copy(pseudo[4:8], d[:])
	pseudo[9] = unix.IPPROTO_UDP
	binary.BigEndian.PutUint16(pseudo[10:], uint16(ulen))
	sum := ^csum(uint32(csum(0, pseudo[:])), udp[:ulen])
	if sum == 0 {
		sum = 0xffff // zero means no checksum
	}
	binary.BigEndian.PutUint16(udp[6:], sum)
}
