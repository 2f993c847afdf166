package proxy_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"io"
	"math/big"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"weir/netstack/proxy"
	"weir/netstack/proxy/proxytest"
	"weir/netstack/proxy/tlshello"
	"weir/policy"
)

// selfSigned is a certificate for any name, for the test's TLS targets.
func selfSigned(t *testing.T) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "weir test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), DNSNames: []string{"*.example", "example"}}
	der, err := x509.CreateCertificate(rand.Reader, tpl, tpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// sniAdmitter accepts every connection to the pipe listener and records
// the service and server name each was admitted with.
type sniAdmitter struct {
	dialer proxy.Dialer
	mu     sync.Mutex
	got    []string // protected by mu: "service sni" per Admit
	ends   int      // protected by mu
}

func (a *sniAdmitter) Admit(r *proxy.ConnRequest) (proxy.Decision, proxy.Session) {
	a.mu.Lock()
	a.got = append(a.got, r.Service.Name+" "+r.ServerName)
	a.mu.Unlock()
	return proxy.Decision{Verdict: proxy.Accept, Target: r.Service.Targets[0], Dialer: a.dialer}, &sniSession{a}
}

type sniSession struct{ a *sniAdmitter }

func (s *sniSession) DialFailed(proxy.Decision, error) proxy.Decision {
	return proxy.Decision{Verdict: proxy.RefuseRST}
}
func (s *sniSession) TargetFailed(proxy.Decision, error) {}
func (*sniSession) Spliced(int64)                        {}
func (s *sniSession) Released()                          {}
func (s *sniSession) End(*proxy.End) {
	s.a.mu.Lock()
	s.a.ends++
	s.a.mu.Unlock()
}

func (a *sniAdmitter) last() (string, int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.got) == 0 {
		return "", a.ends
	}
	return a.got[len(a.got)-1], a.ends
}

func tlsConfig(t testing.TB, def bool) *policy.Config {
	t.Helper()
	vip := []netip.Addr{netip.MustParseAddr("198.18.0.10")}
	tg := func(a string) []*policy.Target {
		return []*policy.Target{{Addr: netip.MustParseAddrPort(a), Weight: 1}}
	}
	svcs := []*policy.VirtualServer{
		{Name: "a", VIPs: vip, Ports: policy.PortRange{Lo: 443, Hi: 443}, Proto: policy.ProtoTLS, SNI: []string{"a.example"}, Targets: tg("198.18.1.1:443")},
		{Name: "b", VIPs: vip, Ports: policy.PortRange{Lo: 443, Hi: 443}, Proto: policy.ProtoTLS, SNI: []string{"*.b.example"}, Targets: tg("198.18.1.2:443")},
	}
	if def {
		svcs = append(svcs, &policy.VirtualServer{Name: "def", VIPs: vip, Ports: policy.PortRange{Lo: 443, Hi: 443}, Proto: policy.ProtoTLS, SNIDefault: true, Targets: tg("198.18.1.3:443")})
	}
	cfg, err := policy.Compile(&policy.Config{Services: svcs, Instance: policy.Instance{Timeouts: policy.Timeouts{Handshake: 300 * time.Millisecond}}})
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestTLSRoute: Go TLS clients through the proxy to a Go TLS server
// behind it: each server name reaches its service and the handshake
// completes end to end (the ClientHello replayed unchanged); no name goes
// to the default; garbage, a hello cut short by a silent client, and a
// name without a service (no default) are reset and counted by reason,
// without reaching Admit.
func TestTLSRoute(t *testing.T) {
	cert := selfSigned(t)
	targets := proxytest.NewListener()
	var wg sync.WaitGroup
	defer func() {
		targets.Close()
		wg.Wait()
	}()
	wg.Add(1)
	go func() { // the TLS target: says which name it was asked for
		defer wg.Done()
		for {
			c, err := targets.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				s := tls.Server(c, &tls.Config{Certificates: []tls.Certificate{cert}})
				if s.Handshake() != nil {
					return
				}
				_, _ = io.WriteString(s, "hello "+s.ConnectionState().ServerName+"\n")
				_ = s.CloseWrite()
				_, _ = io.Copy(io.Discard, s)
			}()
		}
	}()

	for _, def := range []bool{true, false} {
		cfg := tlsConfig(t, def)
		adm := &sniAdmitter{dialer: targets}
		p := proxy.New(proxy.Options{Admitter: adm, RouteSNI: func(vip netip.AddrPort, name string) *policy.VirtualServer {
			return cfg.RouteSNI(vip.Addr(), vip.Port(), name)
		}})
		vip := netip.MustParseAddrPort("198.18.0.10:443")
		first := cfg.Service(vip.Addr(), vip.Port(), policy.IPProtoTCP)
		// conn starts one connection through the proxy and returns the
		// test's end of its client leg.
		conn := func() *proxytest.Conn {
			near, far := proxytest.Pipe()
			go p.HandleConn(near, &proxy.ConnRequest{Client: netip.MustParseAddrPort("198.18.0.2:40000"), VIP: vip, Service: first})
			return far
		}
		served := 0
		for _, tc := range []struct{ sni, want string }{
			{"a.example", "a"}, {"x.b.example", "b"}, {"X.B.Example", "b"}, {"", "def"}, {"other.example", "def"},
		} {
			if !def && tc.want == "def" {
				continue
			}
			far := conn()
			cl := tls.Client(far, &tls.Config{ServerName: tc.sni, InsecureSkipVerify: true})
			if tc.sni == "" {
				cl = tls.Client(far, &tls.Config{InsecureSkipVerify: true}) // no ServerName: no SNI
			}
			_ = far.SetDeadline(time.Now().Add(10 * time.Second))
			if err := cl.Handshake(); err != nil {
				t.Fatalf("%q: handshake through the proxy: %v", tc.sni, err)
			}
			line, err := io.ReadAll(cl)
			if err != nil {
				t.Fatalf("%q: %v", tc.sni, err)
			}
			lower, _ := tlshello.Normalize(tc.sni)
			if tc.sni == "" {
				lower = ""
			}
			if string(line) != "hello "+tc.sni+"\n" { // the hello as sent, unchanged
				t.Errorf("%q: target said %q", tc.sni, line)
			}
			cl.Close()
			served++
			if got, _ := adm.last(); got != tc.want+" "+lower {
				t.Errorf("%q: admitted as %q, want %q", tc.sni, got, tc.want+" "+lower)
			}
		}

		refused := func(name string, reason int, send func(c *proxytest.Conn)) {
			t.Helper()
			before := p.Stats().SNIRefused[reason]
			far := conn()
			go send(far)
			_ = far.SetReadDeadline(time.Now().Add(10 * time.Second))
			if n, err := far.Read(make([]byte, 1)); err == nil {
				t.Fatalf("%s: read %d bytes, want the connection reset", name, n)
			}
			far.Close()
			deadline := time.Now().Add(10 * time.Second)
			for p.Stats().SNIRefused[reason] != before+1 {
				if time.Now().After(deadline) {
					t.Fatalf("%s: SNIRefused %v, want %s counted", name, p.Stats().SNIRefused, proxy.SNIRefusalNames[reason])
				}
				time.Sleep(time.Millisecond)
			}
		}
		refused("garbage", 0, func(c *proxytest.Conn) { _, _ = c.Write([]byte("GET / HTTP/1.1\r\n\r\n")) })
		refused("silent after 3 bytes", 3, func(c *proxytest.Conn) { _, _ = c.Write([]byte{22, 3, 1}) })
		refused("oversized", 2, func(c *proxytest.Conn) { _, _ = c.Write([]byte{22, 3, 1, 0, 4, 1, 1, 0, 0}) })
		if !def {
			refused("no match", proxy.SNINoMatch, func(c *proxytest.Conn) {
				_ = tls.Client(c, &tls.Config{ServerName: "nobody.example", InsecureSkipVerify: true}).Handshake()
			})
		}
		p.Close()
		st := p.Stats()
		if _, ends := adm.last(); ends != served || st.SNIRouted != uint64(served) {
			t.Errorf("default %v: %d Ends, %d routed, want %d (refusals never reach Admit)", def, ends, st.SNIRouted, served)
		}
	}
}

func TestSNIRefusalNames(t *testing.T) {
	for i, n := range tlshello.Reasons {
		if proxy.SNIRefusalNames[i] != n {
			t.Fatalf("SNIRefusalNames %v do not start with tlshello.Reasons %v", proxy.SNIRefusalNames, tlshello.Reasons)
		}
	}
	if len(tlshello.Reasons) != proxy.SNINoMatch {
		t.Fatalf("%d hello reasons, SNINoMatch %d", len(tlshello.Reasons), proxy.SNINoMatch)
	}
}

// BenchmarkConnTLSPeek is a whole connection through the proxy over pipes,
// tcp against tls: the client sends a 1.5 KB ClientHello (Go's) and closes,
// the target reads it all and closes; the difference is the peek's cost
// per connection (reading the hello in two reads, routing, replaying it).
func BenchmarkConnTLSPeek(b *testing.B) {
	c, s := net.Pipe()
	go func() { _ = tls.Client(c, &tls.Config{ServerName: "a.example", InsecureSkipVerify: true}).Handshake() }()
	_ = s.SetReadDeadline(time.Now().Add(10 * time.Second))
	h, err := tlshello.Read(s, 0)
	c.Close()
	s.Close()
	if err != nil {
		b.Fatal(err)
	}
	hello := h.Raw
	cfg := tlsConfig(b, true)
	tcp := *cfg.Services[0]
	tcp.Proto = policy.ProtoTCP
	for _, bc := range []struct {
		name string
		vs   *policy.VirtualServer
	}{{"tcp", &tcp}, {"tls", cfg.Services[0]}} {
		b.Run(bc.name, func(b *testing.B) {
			targets := proxytest.NewListener()
			adm := &sniAdmitter{dialer: targets}
			p := proxy.New(proxy.Options{Admitter: adm, RouteSNI: func(vip netip.AddrPort, name string) *policy.VirtualServer {
				return cfg.RouteSNI(vip.Addr(), vip.Port(), name)
			}})
			vip := netip.MustParseAddrPort("198.18.0.10:443")
			b.ReportAllocs()
			for b.Loop() {
				near, far := proxytest.Pipe()
				go p.HandleConn(near, &proxy.ConnRequest{Client: netip.MustParseAddrPort("198.18.0.2:40000"), VIP: vip, Service: bc.vs})
				go func() {
					_, _ = far.Write(hello)
					_ = far.CloseWrite()
				}()
				t, err := targets.Accept()
				if err != nil {
					b.Fatal(err)
				}
				if n, _ := io.Copy(io.Discard, t); n != int64(len(hello)) {
					b.Fatalf("target read %d bytes, want %d", n, len(hello))
				}
				t.Close()
				_, _ = io.Copy(io.Discard, far)
				far.Close()
			}
			p.Close()
			targets.Close()
		})
	}
}

// TestTLSPeekClose: Close ends a peek that waits on a silent client (the
// handshake timeout 30 s away) at once, counted Aborted, not a refusal.
func TestTLSPeekClose(t *testing.T) {
	cfg := tlsConfig(t, true)
	vs := *cfg.Services[0]
	vs.Timeouts.Handshake = 30 * time.Second
	adm := &sniAdmitter{}
	p := proxy.New(proxy.Options{Admitter: adm})
	near, far := proxytest.Pipe()
	defer far.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.HandleConn(near, &proxy.ConnRequest{Client: netip.MustParseAddrPort("198.18.0.2:40000"), VIP: netip.MustParseAddrPort("198.18.0.10:443"), Service: &vs})
	}()
	deadline := time.Now().Add(10 * time.Second)
	for p.Stats().Pending != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the connection never became pending")
		}
		time.Sleep(time.Millisecond)
	}
	start := time.Now()
	p.Close()
	<-done
	st := p.Stats()
	if time.Since(start) > 5*time.Second || st.Aborted != 1 || st.SNIRefused != [proxy.NumSNIRefusals]uint64{} {
		t.Fatalf("Close took %v; aborted %d, refused %v", time.Since(start), st.Aborted, st.SNIRefused)
	}
	if got, ends := adm.last(); got != "" || ends != 0 {
		t.Fatalf("admitted %q, %d ends", got, ends)
	}
}
