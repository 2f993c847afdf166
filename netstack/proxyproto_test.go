package netstack

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"testing"
	"time"

	"weir/internal/testutil"
	"weir/netstack/proxy"
	"weir/netstack/proxy/proxyproto"
	"weir/policy"
)

// headerEcho serves each connection: it reads a PROXY-protocol header
// (either version), reports it on got, then echoes.
func headerEcho(got chan<- proxyproto.Header) func(net.Conn) {
	return func(c net.Conn) {
		defer c.Close()
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		br := bufio.NewReader(c)
		var h proxyproto.Header // none: Version 0
		if b, err := br.Peek(1); err != nil {
			return
		} else if b[0] == 'P' || b[0] == '\r' {
			if h, err = proxyproto.Read(br, proxyproto.Any); err != nil {
				got <- proxyproto.Header{}
				return
			}
		}
		got <- h
		c.SetReadDeadline(time.Time{})
		io.Copy(c, br)
	}
}

// hostHeaderEcho is headerEcho on a host loopback listener.
func hostHeaderEcho(t *testing.T, network, addr string, got chan<- proxyproto.Header) netip.AddrPort {
	t.Helper()
	l, err := net.Listen(network, addr)
	if err != nil {
		t.Skipf("skipping: no %s loopback: %v", network, err)
	}
	stop := serveListener(l, headerEcho(got))
	t.Cleanup(stop)
	return l.Addr().(*net.TCPAddr).AddrPort()
}

// TestProxyProtocolSend: a target with proxyProtocol v1 or v2 reads the
// header first on every connection, through either dialer (a host socket
// and the back arm), IPv4 and IPv6 clients: the client's address and port
// as weir's client stack dialed from, the VIP's, then the client's bytes
// unchanged. A target without proxyProtocol gets none.
func TestProxyProtocolSend(t *testing.T) {
	back := newBackArm(t)
	got := make(chan proxyproto.Header, 1)
	tg4 := back.addTarget(t, 1, false, nil, headerEcho(got))
	tg6 := back.addTarget(t, 2, true, nil, headerEcho(got))
	host4 := hostHeaderEcho(t, "tcp4", "127.0.0.1:0", got)
	for _, via := range []policy.DialVia{policy.DialHost, policy.DialNetstack} {
		for _, v := range []policy.ProxyProtocol{policy.ProxyNone, policy.ProxyV1, policy.ProxyV2} {
			for _, v6 := range []bool{false, true} {
				t.Run(fmt.Sprintf("%v/%v/v6=%v", via, v, v6), func(t *testing.T) {
					vip := vipV4
					if v6 {
						vip = vipV6
					}
					addr := host4
					switch {
					case via == policy.DialNetstack && v6:
						addr = tg6.addr
					case via == policy.DialNetstack:
						addr = tg4.addr
					}
					vs := &policy.VirtualServer{Name: "pp", VIPs: []netip.Addr{vip}, Ports: policy.PortRange{Lo: 80, Hi: 80}}
					adm := &testAdmitter{target: &policy.Target{Name: "t", Addr: addr, Via: via, ProxyProtocol: v}}
					r := newRig(t, rigOptions{fwd: fwdOptions{Services: services(vs), Admitter: adm, Back: &StackDialer{Stack: back.s}}})
					c := dial(t, r.client, netip.AddrPortFrom(vip, 80))
					defer c.Close()
					me := c.LocalAddr().(*net.TCPAddr).AddrPort()
					if _, err := io.WriteString(c, "ping\n"); err != nil {
						t.Fatal(err)
					}
					var h proxyproto.Header
					select {
					case h = <-got:
					case <-time.After(10 * time.Second):
						t.Fatal("the target saw no connection")
					}
					if v == policy.ProxyNone {
						if h.Version != 0 {
							t.Fatalf("a target without proxyProtocol got a header: %+v", h)
						}
						return
					}
					want := proxyproto.Header{Version: proxyproto.Version(v), Src: netip.AddrPortFrom(me.Addr().Unmap(), me.Port()), Dst: netip.AddrPortFrom(vip, 80)}
					if h != want {
						t.Fatalf("header %+v, want %+v", h, want)
					}
					c.SetReadDeadline(time.Now().Add(10 * time.Second))
					line, err := bufio.NewReader(c).ReadString('\n')
					if err != nil || line != "ping\n" {
						t.Fatalf("echo after the header: %q, %v", line, err)
					}
				})
			}
		}
	}
}

// proxyRig is a rig whose tcp service on VIP port 80 and http service on
// port 8080 accept PROXY-protocol headers of version v from trusted, within
// handshake; port 81 is a tcp service trusting nobody the
// client is. The admitter records each admitted request's client and peer.
type proxyRig struct {
	*rig
	adm *testAdmitter
	mu  sync.Mutex
	req []proxy.ConnRequest // protected by mu
}

func newProxyRig(t *testing.T, v policy.ProxyProtocol, trusted []netip.Prefix, handshake time.Duration) *proxyRig {
	t.Helper()
	echo, stop := echoServer(t, "tcp4", "127.0.0.1:0")
	t.Cleanup(stop)
	mk := func(name string, port uint16, trusted []netip.Prefix, proto policy.ServiceProto) *policy.VirtualServer {
		return &policy.VirtualServer{Name: name, VIPs: []netip.Addr{vipV4, vipV6}, Ports: policy.PortRange{Lo: port, Hi: port}, Proto: proto,
			AcceptProxy: v, TrustedProxies: trusted, Timeouts: policy.Timeouts{Handshake: handshake}}
	}
	tcp, other, web := mk("tcp", 80, trusted, policy.ProtoTCP), mk("other", 81, []netip.Prefix{netip.MustParsePrefix("198.19.9.0/24")}, policy.ProtoTCP), mk("web", 8080, trusted, policy.ProtoHTTP)
	pr := &proxyRig{}
	pr.adm = &testAdmitter{admit: func(r *proxy.ConnRequest) proxy.Decision {
		pr.mu.Lock()
		pr.req = append(pr.req, *r)
		pr.mu.Unlock()
		return proxy.Decision{Verdict: proxy.Accept, Target: &policy.Target{Name: "echo", Addr: echo}}
	}}
	svc := func(addr netip.Addr, port uint16) *policy.VirtualServer {
		for _, vs := range []*policy.VirtualServer{tcp, other, web} {
			if vs.Ports.Lo == port {
				return vs
			}
		}
		return nil
	}
	// The http service has no RequestAdmitter: the proxy reads its header,
	// then (with no Options.HTTP) splices it as a tcp one's, which is
	// enough to see the 400 of a refused header.
	pr.rig = newRig(t, rigOptions{fwd: fwdOptions{Services: svc, Admitter: pr.adm}})
	return pr
}

func (pr *proxyRig) requests() []proxy.ConnRequest {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	return append([]proxy.ConnRequest(nil), pr.req...)
}

func (pr *proxyRig) refused(reason int) uint64 { return pr.px.Stats().ProxyRefused[reason] }

// TestProxyProtocolAccept: a service with acceptProxyProtocol takes the
// client from a trusted sender's header (v1 and v2, IPv4 and IPv6
// clients): the Admitter sees the header's client and the connection's own
// address as Peer, and the payload after the header reaches the target
// unchanged; a LOCAL header keeps the connection's addresses. Refused,
// each counted by its reason and never admitted: a sender outside
// trustedProxies (RST, nothing read), a malformed header, no header, the
// other version's header, and a header not complete within
// timeouts.handshake.
func TestProxyProtocolAccept(t *testing.T) {
	trusted := []netip.Prefix{netip.PrefixFrom(clientV4.Addr(), 32), netip.PrefixFrom(clientV6.Addr(), 128)}
	for _, v := range []policy.ProxyProtocol{policy.ProxyV1, policy.ProxyV2} {
		t.Run(v.String(), func(t *testing.T) {
			pr := newProxyRig(t, v, trusted, time.Second)
			for i, tc := range []struct {
				vip      netip.Addr
				src, dst netip.AddrPort
			}{
				{vipV4, netip.MustParseAddrPort("198.19.0.7:5555"), netip.MustParseAddrPort("198.19.200.1:443")},
				{vipV6, netip.MustParseAddrPort("[fd00:7::7]:6666"), netip.MustParseAddrPort("[fd00:7::1]:443")},
				{vipV4, netip.AddrPort{}, netip.AddrPort{}}, // LOCAL / UNKNOWN
			} {
				c := dial(t, pr.client, netip.AddrPortFrom(tc.vip, 80))
				me := c.LocalAddr().(*net.TCPAddr).AddrPort()
				hdr := proxyproto.Append(nil, proxyproto.Version(v), tc.src, tc.dst)
				c.Write(append(hdr, "payload\n"...))
				c.SetReadDeadline(time.Now().Add(10 * time.Second))
				line, err := bufio.NewReader(c).ReadString('\n')
				c.Close()
				if err != nil || line != "payload\n" {
					t.Fatalf("case %d: echo %q, %v", i, line, err)
				}
				reqs := pr.requests()
				if len(reqs) != i+1 {
					t.Fatalf("case %d: %d admitted", i, len(reqs))
				}
				r := reqs[i]
				wantClient, wantPeer := tc.src, me
				if !tc.src.IsValid() {
					wantClient, wantPeer = me, netip.AddrPort{}
				}
				if r.Client != wantClient || r.Peer != wantPeer || r.Conn() != me {
					t.Errorf("case %d: Client %v Peer %v Conn %v, want %v %v %v", i, r.Client, r.Peer, r.Conn(), wantClient, wantPeer, me)
				}
			}
			other := proxyproto.V1
			if v == policy.ProxyV1 {
				other = proxyproto.V2
			}
			// v1: a TCP4 line with a field missing; v2: a length over
			// the bound.
			malformed := []byte("PROXY TCP4 198.19.0.7 nonsense\r\n")
			if v == policy.ProxyV2 {
				malformed = append(proxyproto.AppendV2(nil, netip.AddrPort{}, netip.AddrPort{})[:12], 0x21, 0x11, 0xff, 0xff)
			}
			good := proxyproto.Append(nil, proxyproto.Version(v), netip.MustParseAddrPort("198.19.0.7:5555"), netip.MustParseAddrPort("198.19.0.80:80"))
			for _, tc := range []struct {
				name   string
				port   uint16
				send   []byte
				reason int
			}{
				{"untrusted", 81, good, proxy.ProxyUntrusted},
				{"malformed", 80, malformed, proxy.ProxyMalformed},
				{"no header", 80, []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"), proxy.ProxyMissing},
				{"the other version", 80, proxyproto.Append(nil, other, netip.MustParseAddrPort("198.19.0.7:5555"), netip.MustParseAddrPort("198.19.0.80:80")), proxy.ProxyMissing},
				{"slow", 80, good[:8], proxy.ProxyTimeout},
			} {
				before := pr.refused(tc.reason)
				admitted := len(pr.requests())
				start := time.Now()
				// An untrusted sender is reset unread: the reset may come
				// before the dial returns.
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				c, err := pr.client.DialTCP(ctx, netip.AddrPort{}, netip.AddrPortFrom(vipV4, tc.port))
				cancel()
				if err == nil {
					c.Write(tc.send)
					c.SetReadDeadline(time.Now().Add(10 * time.Second))
					n, err := c.Read(make([]byte, 64))
					c.Close()
					if err == nil || n > 0 {
						t.Errorf("%s: read %d bytes, %v; want the connection refused", tc.name, n, err)
					}
				} else if tc.reason != proxy.ProxyUntrusted {
					t.Fatalf("%s: dial: %v", tc.name, err)
				}
				if !testutil.Within(5*time.Second, func() bool { return pr.refused(tc.reason) == before+1 }) {
					t.Fatalf("%s: not counted under %s: %v (%v)", tc.name, proxy.ProxyReasons[tc.reason], pr.px.Stats().ProxyRefused, proxy.ProxyReasons)
				}
				if tc.reason == proxy.ProxyTimeout && time.Since(start) < time.Second {
					t.Errorf("slow: refused after %v, before the 1 s handshake timeout", time.Since(start))
				}
				if len(pr.requests()) != admitted {
					t.Errorf("%s: admitted", tc.name)
				}
			}
		})
	}
}

// TestProxyProtocolAcceptHTTP: an http service answers a refused header
// with a 400 (and counts it), and takes a trusted one's client.
func TestProxyProtocolAcceptHTTP(t *testing.T) {
	trusted := []netip.Prefix{netip.PrefixFrom(clientV4.Addr(), 32)}
	pr := newProxyRig(t, policy.ProxyAny, trusted, time.Second)
	c := dial(t, pr.client, netip.AddrPortFrom(vipV4, 8080))
	c.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	c.Close()
	if err != nil || resp.StatusCode != 400 {
		t.Fatalf("no header on http: %v, %v; want 400", resp, err)
	}
	if n := pr.refused(proxy.ProxyMissing); n != 1 {
		t.Errorf("missing refusals %d, want 1", n)
	}
	c = dial(t, pr.client, netip.AddrPortFrom(vipV4, 8080))
	c.Write(append(proxyproto.AppendV1(nil, netip.MustParseAddrPort("198.19.0.9:999"), netip.MustParseAddrPort("198.19.0.80:8080")), "x\n"...))
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	c.Close()
	if err != nil || line != "x\n" {
		t.Fatalf("trusted http: %q, %v", line, err)
	}
	if r := pr.requests(); len(r) != 1 || r[0].Client != netip.MustParseAddrPort("198.19.0.9:999") {
		t.Errorf("admitted %+v", r)
	}
}

// TestProxyProtocolCloseEndsTheWait: Close does not wait out the handshake
// timeout of a connection whose header has not come: it ends the read and
// counts the connection aborted, not refused.
func TestProxyProtocolCloseEndsTheWait(t *testing.T) {
	pr := newProxyRig(t, policy.ProxyV2, []netip.Prefix{netip.PrefixFrom(clientV4.Addr(), 32)}, time.Minute)
	c := dial(t, pr.client, netip.AddrPortFrom(vipV4, 80))
	defer c.Close()
	testutil.Eventually(t, 5*time.Second, func() bool { return pr.px.Stats().Pending == 1 }, "the connection waiting for its header")
	start := time.Now()
	pr.px.Close()
	if d := time.Since(start); d > 20*time.Second {
		t.Errorf("Close took %v", d)
	}
	st := pr.px.Stats()
	if st.Aborted != 1 || st.ProxyRefused != [proxy.NumProxyReasons]uint64{} {
		t.Errorf("aborted %d, refused %v; want 1 aborted, none refused", st.Aborted, st.ProxyRefused)
	}
}

// BenchmarkConnRateProxyProtocol is BenchmarkConnRate (a back-arm target)
// with no PROXY-protocol header, with weir sending a v2 header to the
// target, and with weir accepting one from the client: the header's cost
// per connection, in the same run.
func BenchmarkConnRateProxyProtocol(b *testing.B) {
	for _, mode := range []string{"none", "send-v2", "accept-v2"} {
		b.Run(mode, func(b *testing.B) {
			vs := &policy.VirtualServer{Name: "bench", VIPs: []netip.Addr{vipV4}, Ports: policy.PortRange{Lo: 80, Hi: 80}}
			back := newBackArm(b)
			tg := back.addTarget(b, 1, false, nil, func(c net.Conn) {
				defer c.Close()
				if mode == "send-v2" {
					if _, err := proxyproto.Read(c, proxyproto.V2); err != nil {
						return
					}
				}
				c.Write([]byte("bye\n"))
			})
			target := &policy.Target{Name: "back", Addr: tg.addr, Via: policy.DialNetstack}
			var hdr []byte
			switch mode {
			case "send-v2":
				target.ProxyProtocol = policy.ProxyV2
			case "accept-v2":
				vs.AcceptProxy, vs.TrustedProxies = policy.ProxyV2, []netip.Prefix{clientV4.Masked()}
				hdr = proxyproto.AppendV2(nil, netip.MustParseAddrPort("198.19.0.7:5555"), netip.AddrPortFrom(vipV4, 80))
			}
			r := newRig(b, rigOptions{fwd: fwdOptions{Services: services(vs), Admitter: &testAdmitter{target: target}, Back: &StackDialer{Stack: back.s}}})
			vip := netip.AddrPortFrom(vipV4, 80)
			b.ReportAllocs()
			cpu0, t0 := cpuTime(), time.Now()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				c, err := dialRetryBind(r.client, netip.AddrPort{}, vip)
				if err != nil {
					b.Fatal(err)
				}
				if hdr != nil {
					if _, err := c.Write(hdr); err != nil {
						b.Fatal(err)
					}
				}
				if got, err := io.ReadAll(c); err != nil || string(got) != "bye\n" {
					b.Fatalf("%q, %v", got, err)
				}
				c.Close()
			}
			b.StopTimer()
			el, cpu := time.Since(t0), cpuTime()-cpu0
			b.ReportMetric(float64(b.N)/el.Seconds(), "conns/s")
			b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/conn")
		})
	}
}
