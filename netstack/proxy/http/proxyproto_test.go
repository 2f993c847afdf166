package http_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"weir/internal/testutil"
	"weir/netstack/proxy"
	proxyhttp "weir/netstack/proxy/http"
	"weir/netstack/proxy/proxyproto"
	"weir/netstack/proxy/proxytest"
	"weir/policy"
)

// headerConn is a target connection whose PROXY-protocol header was read.
type headerConn struct {
	net.Conn
	br  *bufio.Reader
	hdr proxyproto.Header
}

func (c *headerConn) Read(b []byte) (int, error) { return c.br.Read(b) }

// headerListener reads the header first on each accepted connection, as a
// target with accept-proxy does; a connection without one fails Accept's
// caller (the test) through bad.
type headerListener struct {
	*proxytest.Listener
	accepted atomic.Int64
	bad      atomic.Int64
}

func (l *headerListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		br := bufio.NewReader(c)
		h, err := proxyproto.Read(br, proxyproto.Any)
		if err != nil {
			l.bad.Add(1)
			c.Close()
			continue
		}
		c.SetReadDeadline(time.Time{})
		l.accepted.Add(1)
		return &headerConn{Conn: c, br: br, hdr: h}, nil
	}
}

type hdrKey struct{}

// TestPoolPerClientWithProxyProtocol: an http service whose target takes a
// PROXY-protocol header pools its target connections per client. Two
// kept-alive clients interleave their requests; each request reaches the
// target on a connection whose header names its own client (the second of
// each reuses its client's connection, never the other's idle one), two
// target connections in all; when a client goes, its pooled connection is
// closed with it. X-Forwarded-For names the client, not the load balancer
// its connection came through.
func TestPoolPerClientWithProxyProtocol(t *testing.T) {
	for _, v := range []policy.ProxyProtocol{policy.ProxyV1, policy.ProxyV2} {
		t.Run(v.String(), func(t *testing.T) {
			targets := &headerListener{Listener: proxytest.NewListener()}
			srv := &http.Server{
				Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					h := r.Context().Value(hdrKey{}).(proxyproto.Header)
					fmt.Fprintf(w, "%v %v %s", h.Src, h.Dst, r.Header.Get("X-Forwarded-For"))
				}),
				ConnContext: func(ctx context.Context, c net.Conn) context.Context {
					return context.WithValue(ctx, hdrKey{}, c.(*headerConn).hdr)
				},
			}
			srvDone := make(chan struct{})
			go func() { defer close(srvDone); _ = srv.Serve(targets) }()
			defer func() { srv.Close(); <-srvDone }()

			cfg, err := policy.Compile(&policy.Config{Services: []*policy.VirtualServer{{
				Name: "web", Proto: policy.ProtoHTTP, VIPs: []netip.Addr{netip.MustParseAddr("198.19.0.80"), netip.MustParseAddr("fd00::80")}, Ports: policy.PortRange{Lo: 80, Hi: 80},
				Targets: []*policy.Target{{Name: "a", Addr: netip.MustParseAddrPort("198.18.0.10:80"), Weight: 1, ProxyProtocol: v}},
			}}})
			if err != nil {
				t.Fatal(err)
			}
			vs := cfg.Services[0]
			adm := &reqAdmitter{target: vs.Targets[0]}
			hs := proxyhttp.New(proxyhttp.Options{RequestAdmitter: adm})
			p := proxy.New(proxy.Options{HTTP: hs, Host: targets})
			defer p.Close()

			type client struct {
				addr, vip netip.AddrPort
				conn      *proxytest.Conn
				br        *bufio.Reader
				done      chan struct{}
			}
			clients := []*client{
				{addr: netip.MustParseAddrPort("198.18.0.2:40000"), vip: netip.MustParseAddrPort("198.19.0.80:80")},
				{addr: netip.MustParseAddrPort("[fd00::3]:40001"), vip: netip.MustParseAddrPort("[fd00::80]:80")},
			}
			for _, c := range clients {
				near, far := proxytest.Pipe()
				c.conn, c.br, c.done = far, bufio.NewReader(far), make(chan struct{})
				go func() {
					defer close(c.done)
					// As after an accepted header: the connection came
					// from an outer load balancer (Peer) for c.addr.
					p.HandleConn(near, &proxy.ConnRequest{Client: c.addr, Peer: netip.MustParseAddrPort("198.18.0.250:5000"), VIP: c.vip, Service: vs})
				}()
			}
			get := func(c *client) string {
				t.Helper()
				_ = c.conn.SetDeadline(time.Now().Add(10 * time.Second))
				errc := make(chan error, 1)
				go func() { _, err := io.WriteString(c.conn, "GET / HTTP/1.1\r\nHost: web\r\n\r\n"); errc <- err }()
				resp, err := http.ReadResponse(c.br, nil)
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(resp.Body)
				if err := <-errc; err != nil {
					t.Fatal(err)
				}
				return string(b)
			}
			for round := range 2 {
				for _, c := range clients {
					if got, want := get(c), fmt.Sprintf("%v %v %v", c.addr, c.vip, c.addr.Addr()); got != want {
						t.Errorf("round %d, client %v: the target's header says %q, want %q", round, c.addr, got, want)
					}
				}
			}
			if n, bad := targets.accepted.Load(), targets.bad.Load(); n != 2 || bad != 0 {
				t.Errorf("%d target connections with a header, %d without; want 2, 0", n, bad)
			}
			// The last response is the client's before its connection is
			// back in the pool.
			testutil.Eventually(t, 5*time.Second, func() bool { return hs.Stats().TargetConnsIdle == 2 }, "both target connections idle in the pool: %+v", hs.Stats())
			if st := hs.Stats(); st.TargetConns != 2 {
				t.Errorf("pool %+v, want 2 target connections", st)
			}
			adm.mu.Lock()
			// Each client's second request reused its first's connection.
			for _, e := range adm.ends {
				if e.Request == nil || e.Request.Reused != (e.Request.Seq == 2) {
					t.Errorf("%v: request %+v, want reused on the second only", e.Stats.Client, e.Request)
				}
			}
			adm.mu.Unlock()
			// The first client goes: its own pooled connection with it.
			clients[0].conn.Close()
			<-clients[0].done
			testutil.Eventually(t, 5*time.Second, func() bool { return hs.Stats().TargetConns == 1 }, "the gone client's target connection closed: %+v", hs.Stats())
			clients[1].conn.Close()
			<-clients[1].done
		})
	}
}
