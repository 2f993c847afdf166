package netstack

import (
	"bytes"
	"crypto/rand"
	"io"
	"net/netip"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"

	"weir/datapath"
	"weir/internal/testutil"
	"weir/policy"
)

// rawTCP4 builds an IPv4 TCP segment from src to dst with the given flags,
// numbers, options (padded to 4 bytes by the caller) and payload length.
func rawTCP4(src, dst netip.AddrPort, flags header.TCPFlags, seq, ack uint32, opts []byte, payload int) []byte {
	tcpLen := header.TCPMinimumSize + len(opts)
	b := make([]byte, header.IPv4MinimumSize+tcpLen+payload)
	ip := header.IPv4(b)
	ip.Encode(&header.IPv4Fields{TotalLength: uint16(len(b)), TTL: 64, Protocol: uint8(header.TCPProtocolNumber),
		SrcAddr: tcpip.AddrFrom4(src.Addr().As4()), DstAddr: tcpip.AddrFrom4(dst.Addr().As4())})
	ip.SetChecksum(^ip.CalculateChecksum())
	tcph := header.TCP(b[header.IPv4MinimumSize:])
	tcph.Encode(&header.TCPFields{SrcPort: src.Port(), DstPort: dst.Port(), SeqNum: seq, AckNum: ack,
		DataOffset: uint8(tcpLen), Flags: flags, WindowSize: 65535})
	copy(tcph[header.TCPMinimumSize:], opts)
	return b
}

func TestMarkSuperseded(t *testing.T) {
	c1, c2 := netip.MustParseAddrPort("198.18.0.2:40000"), netip.MustParseAddrPort("198.18.0.2:40001")
	vip := netip.MustParseAddrPort("198.19.0.80:80")
	ts := []byte{1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2} // NOP NOP timestamps
	sack := []byte{1, 1, 5, 10, 0, 0, 0, 1, 0, 0, 0, 2}
	ack := func(c netip.AddrPort, a uint32) []byte { return rawTCP4(c, vip, header.TCPFlagAck, 7, a, ts, 0) }
	for _, tc := range []struct {
		name string
		pkts [][]byte
		want []bool
	}{
		{"a flow's ACKs: all but the last", [][]byte{ack(c1, 100), ack(c1, 200), ack(c1, 300)}, []bool{true, true, false}},
		{"two flows interleaved", [][]byte{ack(c1, 100), ack(c2, 100), ack(c1, 200), ack(c2, 200)}, []bool{true, true, false, false}},
		{"duplicate ACKs stay (fast retransmit counts them)", [][]byte{ack(c1, 100), ack(c1, 100), ack(c1, 100)}, []bool{false, false, false}},
		{"an older ACK after a newer one stays", [][]byte{ack(c1, 200), ack(c1, 100)}, []bool{false, false}},
		{"acknowledgment numbers wrap", [][]byte{ack(c1, 0xffffff00), ack(c1, 0x10)}, []bool{true, false}},
		{"a SACK block is never skipped", [][]byte{rawTCP4(c1, vip, header.TCPFlagAck, 7, 100, sack, 0), ack(c1, 200)}, []bool{false, false}},
		{"nor does one supersede", [][]byte{ack(c1, 100), rawTCP4(c1, vip, header.TCPFlagAck, 7, 200, sack, 0)}, []bool{false, false}},
		{"data between keeps the order", [][]byte{ack(c1, 100), rawTCP4(c1, vip, header.TCPFlagAck|header.TCPFlagPsh, 7, 150, ts, 10), ack(c1, 200)}, []bool{false, false, false}},
		{"another flow's data is passed over", [][]byte{ack(c1, 100), rawTCP4(c2, vip, header.TCPFlagAck, 7, 150, ts, 10), ack(c1, 200)}, []bool{true, false, false}},
		{"a FIN is not a pure ACK", [][]byte{rawTCP4(c1, vip, header.TCPFlagAck|header.TCPFlagFin, 7, 100, ts, 0), ack(c1, 200)}, []bool{false, false}},
		{"ECE is kept", [][]byte{rawTCP4(c1, vip, header.TCPFlagAck|header.TCPFlagEce, 7, 100, ts, 0), ack(c1, 200)}, []bool{false, false}},
		{"a new sequence number keeps it", [][]byte{ack(c1, 100), rawTCP4(c1, vip, header.TCPFlagAck, 8, 200, ts, 0)}, []bool{false, false}},
		{"garbage between is no flow to pass over", [][]byte{ack(c1, 100), {0x45, 0}, ack(c1, 200)}, []bool{false, false, false}},
		{"no options at all", [][]byte{rawTCP4(c1, vip, header.TCPFlagAck, 7, 100, nil, 0), rawTCP4(c1, vip, header.TCPFlagAck, 7, 200, nil, 0)}, []bool{true, false}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			info := make([]ackInfo, len(tc.pkts))
			skip := make([]bool, len(tc.pkts))
			for i := range skip {
				skip[i] = true // stale marks from an earlier batch are cleared
			}
			n := markSuperseded(tc.pkts, info, skip)
			want := 0
			for i := range skip {
				if skip[i] != tc.want[i] {
					t.Errorf("packet %d: skip %v, want %v", i, skip[i], tc.want[i])
				}
				if tc.want[i] {
					want++
				}
			}
			if n != want {
				t.Errorf("marked %d, want %d", n, want)
			}
		})
	}
	batch := [][]byte{ack(c1, 100), ack(c2, 100), ack(c1, 200), ack(c2, 200)}
	info, skip := make([]ackInfo, 4), make([]bool, 4)
	if a := testing.AllocsPerRun(100, func() { markSuperseded(batch, info, skip) }); a != 0 {
		t.Errorf("markSuperseded allocates %v times per batch", a)
	}
}

// holdingDevice hands its reader batches of up to hold packets: after the
// first packet it waits up to a millisecond for more, so a flow's ACKs
// arrive together as they do on a busy TUN. It counts what it hands over.
type holdingDevice struct {
	datapath.Device
	hold int
	in   chan []byte
	read atomic.Uint64
}

func newHoldingDevice(inner datapath.Device, hold int) *holdingDevice {
	d := &holdingDevice{Device: inner, hold: hold, in: make(chan []byte, 4096)}
	go func() {
		defer close(d.in)
		bufs, sizes := [][]byte{make([]byte, inner.MTU())}, []int{0}
		for {
			n, err := inner.Read(bufs, sizes, 0)
			if n == 1 {
				d.in <- append([]byte(nil), bufs[0][:sizes[0]]...)
			}
			if err != nil {
				return
			}
		}
	}()
	return d
}

func (d *holdingDevice) Read(bufs [][]byte, sizes []int, offset int) (int, error) {
	n := 0
	put := func(p []byte) { sizes[n] = copy(bufs[n][offset:], p); n++ }
	p, ok := <-d.in
	if !ok {
		return 0, os.ErrClosed
	}
	put(p)
	tm := time.NewTimer(time.Millisecond)
	defer tm.Stop()
	for n < min(d.hold, len(bufs)) {
		select {
		case p, ok := <-d.in:
			if !ok {
				d.read.Add(uint64(n))
				return n, nil
			}
			put(p)
			continue
		case <-tm.C:
		}
		break
	}
	d.read.Add(uint64(n))
	return n, nil
}

// TestACKCoalescingTransfer: 4 MiB each way through weir's front link
// while the client's ACKs reach it in batches: everything arrives intact,
// weir coalesced some of the client's pure ACKs, and every packet the device
// handed over was either delivered or coalesced (the link's counters are
// exact).
func TestACKCoalescingTransfer(t *testing.T) {
	taddr, stop := echoServer(t, "tcp4", "127.0.0.1:0")
	defer stop()
	vs := &policy.VirtualServer{Name: "echo", VIPs: []netip.Addr{vipV4}, Ports: policy.PortRange{Lo: 80, Hi: 80}}
	adm := &testAdmitter{target: &policy.Target{Name: "t1", Addr: taddr}, action: &policy.Action{Name: "gold"}, keep: true}
	var hd *holdingDevice
	r := newRig(t, rigOptions{fwd: fwdOptions{Services: services(vs), Admitter: adm},
		wrapFront: func(d datapath.Device) datapath.Device { hd = newHoldingDevice(d, 16); return hd }})
	c := dial(t, r.client, netip.AddrPortFrom(vipV4, 80))
	msg := make([]byte, 4<<20)
	rand.Read(msg)
	go func() {
		c.Write(msg)
		c.CloseWrite()
	}()
	got, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	if !bytes.Equal(got, msg) {
		t.Fatalf("echo: got %d bytes, want %d identical", len(got), len(msg))
	}
	c.Close()
	testutil.Eventually(t, 10*time.Second, func() bool { return adm.nClosed.Load() == 1 }, "connection not closed")
	cs := adm.closedStats()[0]
	if cs.ClientLeg.BytesReceived != uint64(len(msg)) || cs.ClientLeg.BytesSent != uint64(len(msg)) {
		t.Errorf("client leg bytes %d received / %d sent, want %d each way", cs.ClientLeg.BytesReceived, cs.ClientLeg.BytesSent, len(msg))
	}
	st := r.front.Stats()
	if st.RxCoalesced == 0 {
		t.Errorf("no pure ACK coalesced: %+v", st)
	}
	if st.RxPackets+st.RxCoalesced != hd.read.Load() {
		t.Errorf("link: %d delivered + %d coalesced, device handed over %d", st.RxPackets, st.RxCoalesced, hd.read.Load())
	}
	t.Logf("front link: %d packets delivered, %d pure ACKs coalesced; %d sent", st.RxPackets, st.RxCoalesced, st.TxPackets)
}
