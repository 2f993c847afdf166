package netstack

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/stack"

	"weir/datapath"
	"weir/internal/testutil"
	"weir/netstack/proxy"
	"weir/policy"
)

// deadAddr returns a loopback address nothing listens on.
func deadAddr(t *testing.T) netip.AddrPort {
	t.Helper()
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := l.Addr().(*net.TCPAddr).AddrPort()
	l.Close()
	return a
}

func TestDialFailure(t *testing.T) {
	live, stop := echoServer(t, "tcp4", "127.0.0.1:0")
	defer stop()
	dead := &policy.Target{Name: "dead", Addr: deadAddr(t)}
	alive := &policy.Target{Name: "alive", Addr: live}
	vsTCP := &policy.VirtualServer{Name: "tcp", VIPs: []netip.Addr{vipV4}, Ports: policy.PortRange{Lo: 80, Hi: 80}}
	vsHTTP := &policy.VirtualServer{Name: "web", VIPs: []netip.Addr{vipV4}, Ports: policy.PortRange{Lo: 8080, Hi: 8080}, Proto: policy.ProtoHTTP}
	lookup := func(a netip.Addr, p uint16) *policy.VirtualServer {
		if s := services(vsTCP)(a, p); s != nil {
			return s
		}
		return services(vsHTTP)(a, p)
	}

	for _, tc := range []struct {
		name       string
		port       uint16
		dialFailed func(*proxy.ConnRequest, proxy.Decision, error) proxy.Decision
		wantFailed int64 // DialFailed calls
		check      func(t *testing.T, c *Conn, err error)
	}{
		{
			name: "retry-another-target", port: 80,
			dialFailed: func(r *proxy.ConnRequest, d proxy.Decision, err error) proxy.Decision {
				if d.Target != dead || r.Attempt != 1 || err == nil {
					t.Errorf("DialFailed(%+v, %v, %v)", r, d.Target, err)
				}
				return proxy.Decision{Verdict: proxy.Accept, Target: alive}
			},
			wantFailed: 1,
			check: func(t *testing.T, c *Conn, err error) {
				if err != nil {
					t.Fatalf("dial: %v", err)
				}
				defer c.Close()
				if _, err := io.WriteString(c, "hi"); err != nil {
					t.Fatal(err)
				}
				b := make([]byte, 2)
				if _, err := io.ReadFull(c, b); err != nil || string(b) != "hi" {
					t.Fatalf("echo %q, %v", b, err)
				}
			},
		},
		{
			name: "tcp-all-failed-rst", port: 80,
			dialFailed: func(*proxy.ConnRequest, proxy.Decision, error) proxy.Decision {
				return proxy.Decision{Verdict: proxy.RefuseRST}
			},
			wantFailed: 1,
			// Handshake first: the client is connected, then reset.
			check: func(t *testing.T, c *Conn, err error) { wantReset(t, c, err) },
		},
		{
			// The forwarder has no bound of its own: it dials every Accept
			// until the session (the balancer's tried-set) refuses, here
			// after 5 failed dials, more than any forwarder default.
			name: "http-session-bounds-attempts-503", port: 8080,
			dialFailed: func(r *proxy.ConnRequest, d proxy.Decision, err error) proxy.Decision {
				if r.Attempt < 5 {
					return proxy.Decision{Verdict: proxy.Accept, Target: dead}
				}
				return proxy.Decision{Verdict: proxy.Refuse503, Limit: "MaxAttempts", Value: 5, Reason: "No target of this service could be reached."}
			},
			wantFailed: 5,
			check: func(t *testing.T, c *Conn, err error) {
				if err != nil {
					t.Fatalf("dial: %v", err)
				}
				defer c.Close()
				io.WriteString(c, "GET / HTTP/1.0\r\n\r\n")
				c.SetReadDeadline(time.Now().Add(5 * time.Second))
				resp, err := http.ReadResponse(bufio.NewReader(c), nil)
				if err != nil {
					t.Fatal(err)
				}
				body, _ := io.ReadAll(resp.Body)
				if resp.StatusCode != 503 || !strings.Contains(string(body), "MaxAttempts") {
					t.Fatalf("got %d %s", resp.StatusCode, body)
				}
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			adm := &testAdmitter{
				admit:      func(*proxy.ConnRequest) proxy.Decision { return proxy.Decision{Verdict: proxy.Accept, Target: dead} },
				dialFailed: tc.dialFailed,
			}
			r := newRig(t, rigOptions{fwd: fwdOptions{Services: lookup, Admitter: adm}})
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			c, err := r.client.DialTCP(ctx, netip.AddrPort{}, netip.AddrPortFrom(vipV4, tc.port))
			tc.check(t, c, err)
			if got := adm.nFailed.Load(); got != tc.wantFailed {
				t.Errorf("DialFailed called %d times, want %d", got, tc.wantFailed)
			}
			if got := r.stats().DialFailed; got != uint64(tc.wantFailed) {
				t.Errorf("DialFailed counter %d, want %d", got, tc.wantFailed)
			}
		})
	}
}

// TestIdleTimeout: a connection with no traffic is closed after IdleTimeout
// and counted; an active one is not.
func TestIdleTimeout(t *testing.T) {
	live, stop := echoServer(t, "tcp4", "127.0.0.1:0")
	defer stop()
	vs := &policy.VirtualServer{Name: "echo", VIPs: []netip.Addr{vipV4}, Ports: policy.PortRange{Lo: 80, Hi: 80},
		Timeouts: policy.Timeouts{Idle: 300 * time.Millisecond}}
	adm := &testAdmitter{target: &policy.Target{Name: "t", Addr: live}}
	r := newRig(t, rigOptions{fwd: fwdOptions{Services: services(vs), Admitter: adm}})

	idle := dial(t, r.client, netip.AddrPortFrom(vipV4, 80))
	defer idle.Close()
	busy := dial(t, r.client, netip.AddrPortFrom(vipV4, 80))
	defer busy.Close()
	start := time.Now()
	// Keep busy active for twice the idle timeout.
	b := make([]byte, 1)
	for time.Since(start) < 600*time.Millisecond {
		if _, err := busy.Write([]byte("x")); err != nil {
			t.Fatalf("busy connection: %v", err)
		}
		if _, err := io.ReadFull(busy, b); err != nil {
			t.Fatalf("busy connection closed after %v: %v", time.Since(start), err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	idle.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := idle.Read(b); err == nil {
		t.Fatal("idle connection still open")
	}
	if st := r.stats(); st.IdleClosed != 1 {
		t.Errorf("IdleClosed %d, want 1", st.IdleClosed)
	}
}

// TestForwarderClose: Close ends open connections, waits for its
// goroutines, and later SYNs are refused.
func TestForwarderClose(t *testing.T) {
	live, stop := echoServer(t, "tcp4", "127.0.0.1:0")
	defer stop()
	vs := &policy.VirtualServer{Name: "echo", VIPs: []netip.Addr{vipV4}, Ports: policy.PortRange{Lo: 80, Hi: 80}}
	adm := &testAdmitter{target: &policy.Target{Name: "t", Addr: live}}
	r := newRig(t, rigOptions{fwd: fwdOptions{Services: services(vs), Admitter: adm}})
	c := dial(t, r.client, netip.AddrPortFrom(vipV4, 80))
	defer c.Close()
	// Handshake first: the dial returns before weir has admitted and
	// spliced; one echo makes sure it has.
	io.WriteString(c, "x")
	if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	if err := r.fwd.Close(); err != nil {
		t.Fatal(err)
	}
	if adm.nClosed.Load() != 1 || r.stats().Open != 0 {
		t.Errorf("after Close: %d closed, %+v", adm.nClosed.Load(), r.stats())
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Error("connection survived Close")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := r.client.DialTCP(ctx, netip.AddrPort{}, netip.AddrPortFrom(vipV4, 80)); !errors.Is(err, ErrConnectionRefused) {
		t.Errorf("dial after Close: %v, want refused", err)
	}
	if r.stats().RefusedClosed != 1 {
		t.Errorf("RefusedClosed %d", r.stats().RefusedClosed)
	}
}

// TestLinkDropsCounted: packets of neither IP version are counted, and the
// egress queue drops (and counts) when the device cannot keep up.
func TestLinkDropsCounted(t *testing.T) {
	a, b := datapath.NewPipe(datapath.PipeOptions{})
	s, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	defer b.Close()
	nic, err := s.AddNIC(a, NICOptions{Promiscuous: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Write([][]byte{{0x50, 1, 2, 3}, {0x45}}, 0); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, func() bool { return nic.Stats().DroppedMalformed == 1 }, "nic.Stats().DroppedMalformed == 1")
	// A write queue of one whose writer has not started: the first packet
	// waits, the other 99 are dropped and counted.
	le := newLinkEndpoint(b, 0, 1)
	for i := 0; i < 100; i++ {
		var list stack.PacketBufferList
		pkt := rawSYN(netip.MustParseAddrPort("198.18.0.1:1"), netip.MustParseAddrPort("198.18.0.2:2"))
		list.PushBack(stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: buffer.MakeWithData(pkt)}))
		if n, err := le.WritePackets(list); n != 1 || err != nil {
			t.Fatalf("WritePackets = %d, %v", n, err)
		}
		list.DecRef()
	}
	if st := le.stats(); st.DroppedQueueFull != 99 {
		t.Errorf("DroppedQueueFull %d, want 99", st.DroppedQueueFull)
	}
	le.start()
	testutil.Eventually(t, 10*time.Second, func() bool { return le.stats().TxPackets == 1 }, "le.stats().TxPackets == 1")
	le.shutdown()
	if st := le.stats(); st.TxBytes != uint64(header.IPv4MinimumSize+header.TCPMinimumSize) {
		t.Errorf("TxBytes %d", st.TxBytes)
	}
}

// TestTargetReset: a target that resets its connection ends the client's
// connection too, and the connection is reported closed once, with no
// goroutine left behind.
func TestTargetReset(t *testing.T) {
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	stop := serveListener(l, func(c net.Conn) {
		io.ReadFull(c, make([]byte, 4))
		c.(*net.TCPConn).SetLinger(0) // Close sends RST
		c.Close()
	})
	defer stop()
	vs := &policy.VirtualServer{Name: "rst", VIPs: []netip.Addr{vipV4}, Ports: policy.PortRange{Lo: 80, Hi: 80}}
	adm := &testAdmitter{target: &policy.Target{Name: "t", Addr: l.Addr().(*net.TCPAddr).AddrPort()}}
	r := newRig(t, rigOptions{fwd: fwdOptions{Services: services(vs), Admitter: adm}})
	for i := 0; i < 50; i++ {
		c := dial(t, r.client, netip.AddrPortFrom(vipV4, 80))
		io.WriteString(c, "ping")
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadAll(c); errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("connection %d: client not told of the target's reset", i)
		}
		c.Close()
	}
	testutil.Eventually(t, 10*time.Second, func() bool { return adm.nClosed.Load() == 50 }, "adm.nClosed.Load() == 50")
	if st := r.stats(); st.Open != 0 || st.Accepted != 50 {
		t.Errorf("stats %+v", st)
	}
}
