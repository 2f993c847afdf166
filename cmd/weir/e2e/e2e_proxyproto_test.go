//go:build linux

package e2e

// The PROXY protocol both ways against Debian's HAProxy (issue 26;
// scripts/deps.sh installs it): weir accepts the header of an outer HAProxy
// (send-proxy-v2, send-proxy) and sends its own to an inner HAProxy
// (accept-proxy), whose log names the client it was told of.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"weir/cmd/weir/api"
	"weir/internal/testutil"
	"weir/netstack/proxy/proxyproto"
)

// haproxyConfig: the outer frontends (o<version><family>) forward to weir's
// VIPs with a header, from the trusted addresses 198.18.1.1 and fd00:1::1;
// the inner ones (i1, i2: tcp to the echo server; i3: http to the
// backend) accept weir's header and log the client it names.
const haproxyConfig = `global
	log stdout format raw local0
defaults
	mode tcp
	log global
	timeout connect 5s
	timeout client 30s
	timeout server 30s
frontend o2v4
	bind 198.18.1.1:7001
	default_backend w2v4
backend w2v4
	server w 198.18.0.40:80 send-proxy-v2 source 198.18.1.1
frontend o2v6
	bind [fd00:1::1]:7001
	default_backend w2v6
backend w2v6
	server w [fd00::40]:80 send-proxy-v2 source ipv6@fd00:1::1:0
frontend o1v4
	bind 198.18.1.1:7002
	default_backend w1v4
backend w1v4
	server w 198.18.0.41:80 send-proxy source 198.18.1.1
frontend o1v6
	bind [fd00:1::1]:7002
	default_backend w1v6
backend w1v6
	server w [fd00::41]:80 send-proxy source ipv6@fd00:1::1:0
frontend ohv4
	bind 198.18.1.1:7003
	default_backend whv4
backend whv4
	server w 198.18.0.42:80 send-proxy-v2 source 198.18.1.1
frontend ohv6
	bind [fd00:1::1]:7003
	default_backend whv6
backend whv6
	server w [fd00::42]:80 send-proxy-v2 source ipv6@fd00:1::1:0
frontend i1
	bind 198.18.1.1:7101 accept-proxy
	log-format "INNER %ft client=%ci:%cp"
	default_backend echo
frontend i2
	bind 198.18.1.1:7102 accept-proxy
	log-format "INNER %ft client=%ci:%cp"
	default_backend echo
frontend i3
	mode http
	bind 198.18.1.1:7103 accept-proxy
	option forwardfor
	log-format "INNER %ft client=%ci:%cp %{+Q}r"
	default_backend web
backend echo
	server e 198.18.1.3:9000
backend web
	mode http
	server b 198.18.1.3:8081
`

// syncBuffer is a bytes buffer HAProxy's output is written to while the
// test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startHAProxy runs HAProxy in weir's namespace on cfg, in the foreground
// (-db), its log on out; it is killed when the test ends.
func (w *weirProc) startHAProxy(cfg string) *syncBuffer {
	w.t.Helper()
	bin, err := exec.LookPath("haproxy")
	if err != nil {
		if _, serr := os.Stat("/usr/sbin/haproxy"); serr != nil {
			w.t.Skip("skipping: haproxy is not installed; scripts/deps.sh installs it")
		}
		bin = "/usr/sbin/haproxy"
	}
	path := filepath.Join(w.t.TempDir(), "haproxy.cfg")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		w.t.Fatal(err)
	}
	out := &syncBuffer{}
	cmd := exec.Command(bin, "-db", "-f", path)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	started, done := make(chan error, 1), make(chan struct{})
	go w.ns.Do(func() error { // the child inherits the thread's namespace
		defer close(done)
		if err := cmd.Start(); err != nil {
			started <- err
			return nil
		}
		started <- nil
		cmd.Wait()
		return nil
	})
	if err := <-started; err != nil {
		w.t.Fatalf("start haproxy: %v", err)
	}
	w.t.Cleanup(func() {
		cmd.Process.Kill()
		<-done
		if w.t.Failed() {
			w.t.Logf("haproxy output:\n%s", out.String())
		}
	})
	// Ready once its last frontend accepts.
	if !testutil.WithinEvery(10*time.Second, 20*time.Millisecond, func() bool {
		c, err := w.ns.Dial(context.Background(), "tcp", "198.18.1.1:7103")
		if err == nil {
			c.Close()
		}
		return err == nil
	}) {
		w.t.Fatalf("haproxy not listening after 10s:\n%s", out.String())
	}
	return out
}

// connections fetches /connections.
func (w *weirProc) connections() []api.Connection {
	w.t.Helper()
	var cs []api.Connection
	if err := w.GetJSON("/connections", &cs); err != nil {
		w.t.Fatal(err)
	}
	return cs
}

// TestE2EProxyProtocolHAProxy: clients reach weir through an outer HAProxy
// that sends v2 or v1 headers, over IPv4 and IPv6; weir takes the header's
// client as the client (the rule on the real client's address gives its
// connection the action gold and its ToS 0xA0 on weir's packets toward the
// load balancer, another client's none; the access log names
// the real client and the proxy), and sends a header to an inner HAProxy
// with accept-proxy, whose log shows the real client's address and port,
// tcp and http. The health checks that go through the inner HAProxy pass
// (weir's address-less header first). A sender outside trustedProxies is
// refused (RST, 400 for http) and counted as untrusted.
func TestE2EProxyProtocolHAProxy(t *testing.T) {
	access := filepath.Join(t.TempDir(), "access.log")
	w := startWeir(t, "proxyproto.yaml", "--access-log", access)
	w.addIPv6Targets()
	w.echo("198.18.1.3:9000")
	w.backend("b", "198.18.1.3:8081", 0)
	hlog := w.startHAProxy(haproxyConfig)

	// The checks write their header, then PING, through HAProxy to the
	// echo server: passing means HAProxy took weir's LOCAL / UNKNOWN
	// header.
	w.waitStatus(15*time.Second, "the health checks through the inner HAProxy passing", func(st api.Status) bool {
		n := 0
		for _, svc := range []string{"front", "front1"} {
			if s := statusService(st, svc); s != nil {
				for _, tg := range s.Targets {
					if tg.Check != nil && tg.Check.OK && tg.HealthUp {
						n++
					}
				}
			}
		}
		return n == 2
	})

	soFar, _ := w.capture(t)
	type client struct {
		family, outer, from string
		gold                bool
	}
	var served []string // the real clients' ip:port, for the access log
	for _, ver := range []struct {
		name, port, service string
	}{{"v2", "7001", "front"}, {"v1", "7002", "front1"}} {
		for _, c := range []client{
			{"ipv4", "198.18.1.1", "198.18.1.2", true}, {"ipv4", "198.18.1.1", "198.18.1.3", false},
			{"ipv6", "fd00:1::1", "fd00:1::2", true}, {"ipv6", "fd00:1::1", "fd00:1::3", false},
		} {
			name := fmt.Sprintf("%s %s from %s", ver.name, c.family, c.from)
			conn, err := w.dialFrom(c.from, net.JoinHostPort(c.outer, ver.port))
			if err != nil {
				t.Fatalf("%s: dial the outer HAProxy: %v", name, err)
			}
			me := conn.LocalAddr().(*net.TCPAddr).AddrPort()
			me = netip.AddrPortFrom(me.Addr().Unmap(), me.Port())
			conn.SetDeadline(time.Now().Add(10 * time.Second))
			br := bufio.NewReader(conn)
			if _, err := io.WriteString(conn, "hello "+name+"\n"); err != nil {
				t.Fatalf("%s: write: %v", name, err)
			}
			line, err := br.ReadString('\n')
			if err != nil || line != "hello "+name+"\n" {
				t.Fatalf("%s: echo %q, %v", name, line, err)
			}
			// While it is open, weir lists the connection under the real
			// client, with the action of the real client's rule.
			var found *api.Connection
			for _, x := range w.connections() {
				if x.Service == ver.service && x.Client == me.String() {
					found = &x
					break
				}
			}
			switch {
			case found == nil:
				t.Errorf("%s: /connections has no %s connection from %s: %+v", name, ver.service, me, w.connections())
			case c.gold && found.Action != "gold":
				t.Errorf("%s: action %q, want gold (the rule on the real client's address)", name, found.Action)
			case !c.gold && found.Action != "":
				t.Errorf("%s: action %q, want none", name, found.Action)
			}
			conn.Close()
			// The datapath marks weir's packets toward the load balancer
			// with the real client's rule: the echo's segment carries the
			// gold action's ToS 0xA0 for the real client 198.18.1.2
			// (fd00:1::2), none for the other.
			wantTOS := uint8(0)
			if c.gold {
				wantTOS = 0xa0
			}
			var echo *capturedPacket
			if !testutil.WithinEvery(5*time.Second, 10*time.Millisecond, func() bool {
				for _, p := range soFar() {
					if !p.outgoing && strings.Contains(string(p.tcp.Payload), "hello "+name+"\n") {
						echo = &p
						return true
					}
				}
				return false
			}) {
				t.Errorf("%s: the capture on weir0 saw no echo toward the load balancer", name)
			} else if echo.tos != wantTOS {
				t.Errorf("%s: the echo toward the load balancer has ToS %#x, want %#x", name, echo.tos, wantTOS)
			}
			// The inner HAProxy logs the connection when it ends: the
			// client weir's header named.
			want := "INNER " + map[string]string{"front": "i1", "front1": "i2"}[ver.service] + " client=" + me.String()
			if c.family == "ipv6" {
				want = "INNER " + map[string]string{"front": "i1", "front1": "i2"}[ver.service] + " client=" + me.Addr().String() + ":" + fmt.Sprint(me.Port())
			}
			if !testutil.WithinEvery(10*time.Second, 20*time.Millisecond, func() bool { return strings.Contains(hlog.String(), want) }) {
				t.Errorf("%s: the inner HAProxy's log has no %q:\n%s", name, want, hlog.String())
			}
			served = append(served, me.String())
		}
	}

	// http: the request goes through weir's request proxy and pool.
	for _, c := range []struct{ outer, from string }{{"198.18.1.1", "198.18.1.2"}, {"fd00:1::1", "fd00:1::2"}} {
		conn, err := w.dialFrom(c.from, net.JoinHostPort(c.outer, "7003"))
		if err != nil {
			t.Fatalf("http from %s: %v", c.from, err)
		}
		me := conn.LocalAddr().(*net.TCPAddr).AddrPort()
		conn.SetDeadline(time.Now().Add(10 * time.Second))
		fmt.Fprintf(conn, "GET /pp HTTP/1.1\r\nHost: web\r\nConnection: close\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("http from %s: %v", c.from, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		conn.Close()
		if resp.StatusCode != 200 {
			t.Errorf("http from %s: status %d", c.from, resp.StatusCode)
		}
		want := "INNER i3 client=" + me.Addr().Unmap().String() + ":" + fmt.Sprint(me.Port())
		if !testutil.WithinEvery(10*time.Second, 20*time.Millisecond, func() bool { return strings.Contains(hlog.String(), want) }) {
			t.Errorf("http from %s: the inner HAProxy's log has no %q:\n%s", c.from, want, hlog.String())
		}
		served = append(served, netip.AddrPortFrom(me.Addr().Unmap(), me.Port()).String())
	}

	// A sender outside trustedProxies (weir's namespace's own address
	// 198.18.0.1, not the outer HAProxy's) is refused, even with a
	// well-formed header: RST for tcp, 400 for http.
	hdr := proxyproto.AppendV2(nil, netip.MustParseAddrPort("198.18.1.2:4444"), netip.MustParseAddrPort("198.18.0.40:80"))
	// weir resets it as soon as the handshake is through, unread: the
	// reset may come before connect returns.
	conn, err := w.dialFrom("198.18.0.1", "198.18.0.40:80")
	if err == nil {
		conn.SetDeadline(time.Now().Add(10 * time.Second))
		conn.Write(append(hdr, "hello\n"...))
		var n int
		n, err = conn.Read(make([]byte, 64))
		if err == nil {
			t.Errorf("untrusted tcp: read %d bytes, want a reset", n)
		}
		conn.Close()
	}
	if err != nil && !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, io.EOF) {
		t.Errorf("untrusted tcp: %v, want a reset", err)
	}
	conn, err = w.dialFrom("198.18.0.1", "198.18.0.42:80")
	if err != nil {
		t.Fatal(err)
	}
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	hdr = proxyproto.AppendV2(nil, netip.MustParseAddrPort("198.18.1.2:4444"), netip.MustParseAddrPort("198.18.0.42:80"))
	conn.Write(append(hdr, "GET / HTTP/1.1\r\nHost: web\r\n\r\n"...))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil || resp.StatusCode != 400 {
		t.Errorf("untrusted http: %v, %v; want a 400", resp, err)
	}
	conn.Close()
	st := w.waitStatus(5*time.Second, "two untrusted refusals counted", func(st api.Status) bool {
		for _, d := range st.Forwarder.ProxyRefused {
			if d.Reason == "untrusted" {
				return d.Count == 2
			}
		}
		return false
	})
	t.Logf("refused: %+v", st.Forwarder.ProxyRefused)

	// The access log names the real clients, and the outer HAProxy as
	// the proxy.
	w.signal(os.Interrupt) // weir flushes the access log on exit
	if _, err := w.Wait(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	logged := map[string]string{}
	for _, r := range accessRecords(t, access) {
		c, _ := r["client"].(string)
		p, _ := r["proxy"].(string)
		logged[c] = p
	}
	for _, c := range served {
		p, ok := logged[c]
		want := "198.18.1.1:"
		if strings.HasPrefix(c, "[") {
			want = "[fd00:1::1]:"
		}
		if !ok || !strings.HasPrefix(p, want) {
			t.Errorf("access log: client %s logged %v with proxy %q, want the proxy %s*", c, ok, p, want)
		}
	}
}
