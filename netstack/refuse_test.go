package netstack

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net/http"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/header"

	"weir/datapath"
	"weir/internal/testutil"
	"weir/netstack/proxy"
	"weir/policy"
)

// tcpFlagCounter wraps weir's end of the pair and counts, per TCP flag
// combination, what weir sends; drop, when set, decides per packet whether
// weir's egress packet is lost.
type tcpFlagCounter struct {
	datapath.Device
	synAck, rst, icmpUnreach atomic.Int64
	seen                     atomic.Int64
}

func (d *tcpFlagCounter) Write(bufs [][]byte, offset int) (int, error) {
	for _, b := range bufs {
		p := b[offset:]
		d.seen.Add(1)
		var proto uint8
		var l4 []byte
		switch p[0] >> 4 {
		case 4:
			proto, l4 = p[9], p[int(p[0]&0xf)*4:]
		case 6:
			proto, l4 = p[6], p[40:]
		}
		switch proto {
		case uint8(header.TCPProtocolNumber):
			f := l4[13]
			if f&uint8(header.TCPFlagSyn) != 0 && f&uint8(header.TCPFlagAck) != 0 {
				d.synAck.Add(1)
			}
			if f&uint8(header.TCPFlagRst) != 0 {
				d.rst.Add(1)
			}
		case uint8(header.ICMPv4ProtocolNumber):
			if l4[0] == uint8(header.ICMPv4DstUnreachable) {
				d.icmpUnreach.Add(1)
			}
		case uint8(header.ICMPv6ProtocolNumber):
			if l4[0] == uint8(header.ICMPv6DstUnreachable) {
				d.icmpUnreach.Add(1)
			}
		}
	}
	return d.Device.Write(bufs, offset)
}

func TestRefusals(t *testing.T) {
	vsTCP := &policy.VirtualServer{Name: "tcp", VIPs: []netip.Addr{vipV4, vipV6}, Ports: policy.PortRange{Lo: 80, Hi: 80}}
	vsHTTP := &policy.VirtualServer{Name: "web", VIPs: []netip.Addr{vipV4, vipV6}, Ports: policy.PortRange{Lo: 8080, Hi: 8080}, Proto: policy.ProtoHTTP}
	lookup := func(a netip.Addr, p uint16) *policy.VirtualServer {
		if s := services(vsTCP)(a, p); s != nil {
			return s
		}
		return services(vsHTTP)(a, p)
	}
	refuse := proxy.Decision{Verdict: proxy.Refuse503, Limit: "MaxConnections", Value: 42, Reason: "Too many <connections>.", RetryAfter: 3 * time.Second}
	adm := &testAdmitter{admit: func(*proxy.ConnRequest) proxy.Decision { return refuse }}
	var counter *tcpFlagCounter
	r := newRig(t, rigOptions{
		fwd: fwdOptions{Services: lookup, Admitter: adm},
		wrapFront: func(d datapath.Device) datapath.Device {
			counter = &tcpFlagCounter{Device: d}
			return counter
		},
	})
	for _, vip := range []netip.Addr{vipV4, vipV6} {
		t.Run("rst/"+vip.String(), func(t *testing.T) {
			// A 503 refusal of a tcp service is a RST once the handshake
			// is complete (admission comes after it).
			before, beforeRST := counter.synAck.Load(), counter.rst.Load()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			c, err := r.client.DialTCP(ctx, netip.AddrPort{}, netip.AddrPortFrom(vip, 80))
			wantReset(t, c, err)
			if n := counter.synAck.Load() - before; n != 1 {
				t.Errorf("weir sent %d SYN-ACKs, want 1", n)
			}
			if n := counter.rst.Load() - beforeRST; n != 1 {
				t.Errorf("weir sent %d RSTs, want 1", n)
			}
		})
		t.Run("no-service/"+vip.String(), func(t *testing.T) {
			before := r.stats().NoService
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_, err := r.client.DialTCP(ctx, netip.AddrPort{}, netip.AddrPortFrom(vip, 81))
			if !errors.Is(err, ErrConnectionRefused) {
				t.Fatalf("dial: %v, want connection refused", err)
			}
			if n := r.stats().NoService - before; n != 1 {
				t.Errorf("NoService rose by %d, want 1", n)
			}
		})
		t.Run("udp/"+vip.String(), func(t *testing.T) {
			before := counter.icmpUnreach.Load()
			beforeStat := r.stats().UDPUnreachable
			laddr := clientV4.Addr()
			if vip.Is6() {
				laddr = clientV6.Addr()
			}
			proto := protoOf(vip)
			uc, err := gonet.DialUDP(r.client.s, &tcpip.FullAddress{Addr: tcpAddr(laddr)}, &tcpip.FullAddress{Addr: tcpAddr(vip), Port: 53}, proto)
			if err != nil {
				t.Fatal(err)
			}
			defer uc.Close()
			if _, err := uc.Write([]byte("hello")); err != nil {
				t.Fatal(err)
			}
			testutil.Eventually(t, 5*time.Second, func() bool { return counter.icmpUnreach.Load() != before },
				"no ICMP unreachable for UDP to no virtual server")
			if r.stats().UDPUnreachable == beforeStat {
				t.Error("UDPUnreachable not counted")
			}
		})
		t.Run("503/"+vip.String(), func(t *testing.T) {
			c := dial(t, r.client, netip.AddrPortFrom(vip, 8080))
			defer c.Close()
			if _, err := io.WriteString(c, "GET /index.html HTTP/1.1\r\nHost: x\r\nUser-Agent: test\r\n\r\n"); err != nil {
				t.Fatal(err)
			}
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatalf("read response: %v", err)
			}
			body, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatalf("read body: %v", err)
			}
			if resp.StatusCode != 503 || resp.Header.Get("Retry-After") != "3" ||
				!strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") || !resp.Close {
				t.Errorf("response %d, headers %v", resp.StatusCode, resp.Header)
			}
			for _, want := range []string{"MaxConnections", "42", "Too many &lt;connections&gt;."} {
				if !strings.Contains(string(body), want) {
					t.Errorf("page lacks %q:\n%s", want, body)
				}
			}
			// The access log hears the request line and the page's size.
			testutil.Eventually(t, 5*time.Second, func() bool { return adm.lastRefusal().Status == 503 },
				"no 503 refusal reported; last %+v", adm.lastRefusal())
			if got := adm.lastRefusal(); got.RequestLine != "GET /index.html HTTP/1.1" || got.Bytes < len(body) {
				t.Errorf("reported refusal %+v (body %d bytes)", got, len(body))
			}
		})
	}
	st := r.stats()
	if st.Refused503 != 2 || st.RefusedRST != 2 || st.Accepted != 0 {
		t.Errorf("stats %+v", st)
	}
	if n := adm.refusalCount(); n != 4 {
		t.Errorf("%d refusals reported, want 4 (2 RST, 2 pages)", n)
	}
}

// TestHandshakeTimeout: a client whose final ACK never arrives holds a
// pending slot only until HandshakeTimeout.
func TestHandshakeTimeout(t *testing.T) {
	taddr, stop := echoServer(t, "tcp4", "127.0.0.1:0")
	defer stop()
	vs := &policy.VirtualServer{Name: "echo", VIPs: []netip.Addr{vipV4}, Ports: policy.PortRange{Lo: 80, Hi: 80},
		Timeouts: policy.Timeouts{Handshake: 300 * time.Millisecond}}
	adm := &testAdmitter{target: &policy.Target{Name: "t", Addr: taddr}}
	r := newRig(t, rigOptions{fwd: fwdOptions{Services: services(vs), Admitter: adm}, rawClient: true})
	// Inject a bare SYN into weir: nobody will answer its SYN-ACK.
	syn := rawSYN(netip.AddrPortFrom(clientV4.Addr(), 40000), netip.AddrPortFrom(vipV4, 80))
	if _, err := r.clientDev.Write([][]byte{syn}, 0); err != nil {
		t.Fatal(err)
	}
	testutil.Within(5*time.Second, func() bool { return r.stats().HandshakeTimedOut > 0 })
	testutil.Within(5*time.Second, func() bool { return r.stats().Pending == 0 })
	st := r.stats()
	if st.HandshakeTimedOut != 1 || st.Pending != 0 {
		t.Fatalf("after the timeout: %+v", st)
	}
	// Handshake first: the half-open connection never reached admission,
	// so it held no admission slot and no target connection.
	if n := adm.nAdmit.Load(); n != 0 {
		t.Errorf("Admit called %d times for a handshake that never completed", n)
	}
	if got := adm.outcomes(); len(got) != 0 {
		t.Errorf("outcomes %v, want none", got)
	}
}

// rawSYN builds an IPv4 TCP SYN from src to dst.
func rawSYN(src, dst netip.AddrPort) []byte {
	b := make([]byte, header.IPv4MinimumSize+header.TCPMinimumSize)
	ip := header.IPv4(b)
	ip.Encode(&header.IPv4Fields{
		TotalLength: uint16(len(b)),
		TTL:         64,
		Protocol:    uint8(header.TCPProtocolNumber),
		SrcAddr:     tcpAddr(src.Addr()),
		DstAddr:     tcpAddr(dst.Addr()),
	})
	ip.SetChecksum(^ip.CalculateChecksum())
	tcph := header.TCP(b[header.IPv4MinimumSize:])
	tcph.Encode(&header.TCPFields{
		SrcPort:    src.Port(),
		DstPort:    dst.Port(),
		SeqNum:     1000,
		DataOffset: header.TCPMinimumSize,
		Flags:      header.TCPFlagSyn,
		WindowSize: 65535,
	})
	xsum := header.PseudoHeaderChecksum(header.TCPProtocolNumber, tcpAddr(src.Addr()), tcpAddr(dst.Addr()), uint16(header.TCPMinimumSize))
	tcph.SetChecksum(^tcph.CalculateChecksum(xsum))
	return b
}

// TestMaxInFlight: on the tcp.Forwarder path, SYNs beyond MaxInFlight
// half-open handshakes are dropped and counted, and the slots free once the
// handshakes time out; none reached admission.
func TestMaxInFlight(t *testing.T) {
	vs := &policy.VirtualServer{Name: "tcp", VIPs: []netip.Addr{vipV4}, Ports: policy.PortRange{Lo: 80, Hi: 80},
		Timeouts: policy.Timeouts{Handshake: 500 * time.Millisecond}}
	adm := &testAdmitter{}
	r := newRig(t, rigOptions{fwd: fwdOptions{Services: services(vs), Admitter: adm, MaxInFlight: 2}, rawClient: true})
	for port := uint16(1000); port < 1005; port++ {
		syn := rawSYN(netip.AddrPortFrom(clientV4.Addr(), port), netip.AddrPortFrom(vipV4, 80))
		if _, err := r.clientDev.Write([][]byte{syn}, 0); err != nil {
			t.Fatal(err)
		}
	}
	testutil.Eventually(t, 10*time.Second, func() bool { st := r.stats(); return st.Pending == 2 && st.DroppedInFlight == 3 },
		"2 pending and 3 dropped; stats %+v", r.stats())
	testutil.Eventually(t, 10*time.Second, func() bool { st := r.stats(); return st.Pending == 0 && st.HandshakeTimedOut == 2 },
		"none pending and 2 timed out; stats %+v", r.stats())
	if n := adm.nAdmit.Load(); n != 0 {
		t.Errorf("Admit called %d times", n)
	}
}

// TestInFlightPerVIP: on the tcp.Forwarder path one VIP's half-open
// handshakes cannot take another VIP's slots.
func TestInFlightPerVIP(t *testing.T) {
	other := netip.MustParseAddr("198.19.0.81")
	vs := &policy.VirtualServer{Name: "tcp", VIPs: []netip.Addr{vipV4, other}, Ports: policy.PortRange{Lo: 80, Hi: 80},
		Timeouts: policy.Timeouts{InFlightPerVIP: 2}}
	r := newRig(t, rigOptions{fwd: fwdOptions{Services: services(vs), Admitter: &testAdmitter{}}, rawClient: true})
	for port := uint16(1000); port < 1010; port++ {
		syn := rawSYN(netip.AddrPortFrom(clientV4.Addr(), port), netip.AddrPortFrom(vipV4, 80))
		if _, err := r.clientDev.Write([][]byte{syn}, 0); err != nil {
			t.Fatal(err)
		}
	}
	testutil.Eventually(t, 10*time.Second, func() bool { st := r.stats(); return st.Pending == 2 && st.DroppedInFlight == 8 },
		"2 pending and 8 dropped; stats %+v", r.stats())
	syn := rawSYN(netip.AddrPortFrom(clientV4.Addr(), 2000), netip.AddrPortFrom(other, 80))
	if _, err := r.clientDev.Write([][]byte{syn}, 0); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, func() bool { st := r.stats(); return st.Pending == 3 && st.DroppedInFlight == 8 },
		"the other VIP's SYN pending; stats %+v", r.stats())
}
