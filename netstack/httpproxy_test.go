package netstack

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"weir/internal/testutil"
	"weir/netstack/proxy"
	"weir/policy"
)

// testHTTPAdmitter admits every client connection and request to target;
// its request sessions are testSessions (End once, checked).
type testHTTPAdmitter struct {
	testAdmitter
	mu      sync.Mutex
	bad     []int              // protected by mu: BadRequest statuses
	reqEnds []proxy.RequestEnd // protected by mu
	clients atomic.Int64
	// moved and movedWire add up every request's Moved reports;
	// movedAfterEnd counts reports after a session's End (a bug),
	// movedAfterRelease those after its Released.
	moved, movedWire, movedAfterEnd, movedAfterRelease atomic.Int64
}

func (a *testHTTPAdmitter) AdmitClient(*proxy.ConnRequest) (proxy.Decision, func()) {
	a.clients.Add(1)
	return proxy.Decision{Verdict: proxy.Accept}, func() { a.clients.Add(-1) }
}

func (a *testHTTPAdmitter) AdmitRequest(r *proxy.ConnRequest, _ *proxy.Request) (proxy.Decision, proxy.RequestSession) {
	d, s := a.Admit(r)
	return d, &httpTestSession{testSession: s.(*testSession), a: a}
}

func (a *testHTTPAdmitter) BadRequest(_ *proxy.ConnRequest, e *proxy.RequestEnd) {
	a.mu.Lock()
	a.bad = append(a.bad, e.Status)
	a.mu.Unlock()
}

type httpTestSession struct {
	*testSession
	a *testHTTPAdmitter
}

func (s *httpTestSession) Moved(payload, wire int64) {
	if s.ended.Load() {
		s.a.movedAfterEnd.Add(1)
	}
	if s.released.Load() {
		s.a.movedAfterRelease.Add(1)
	}
	s.a.moved.Add(payload)
	s.a.movedWire.Add(wire)
}

func (s *httpTestSession) End(e *proxy.End) {
	s.a.mu.Lock()
	s.a.reqEnds = append(s.a.reqEnds, *e.Request)
	s.a.mu.Unlock()
	s.testSession.End(e)
}

// httpRig is a forwarder for one http virtual server whose one target is h
// served on a host socket; it returns the rig, the admitter and the
// number of target connections the server accepted.
func httpRig(t *testing.T, h http.Handler, o policy.HTTPOptions) (*rig, *testHTTPAdmitter, *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var conns atomic.Int64
	srv := &http.Server{Handler: h, ConnState: func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	vs := &policy.VirtualServer{Name: "web", VIPs: []netip.Addr{vipV4}, Ports: policy.PortRange{Lo: 80, Hi: 80}, Proto: policy.ProtoHTTP, HTTP: o}
	target := &policy.Target{Name: "t1", Addr: netip.MustParseAddrPort(ln.Addr().String())}
	adm := &testHTTPAdmitter{testAdmitter: testAdmitter{target: target}}
	r := newRig(t, rigOptions{fwd: fwdOptions{Services: services(vs), Admitter: adm, RequestAdmitter: adm}})
	return r, adm, &conns
}

// echoHeaders answers with the request's method, body size and headers.
// /raw answers with a body that only the close ends.
var echoHeaders = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/raw" {
		c, bw, _ := w.(http.Hijacker).Hijack()
		bw.WriteString("HTTP/1.1 200 OK\r\n\r\nuntil the close")
		bw.Flush()
		c.Close()
		return
	}
	n, _ := io.Copy(io.Discard, r.Body)
	fmt.Fprintf(w, "%s %d\n", r.Method, n)
	for k, v := range r.Header {
		fmt.Fprintf(w, "%s: %s\n", k, strings.Join(v, ","))
	}
})

func TestHTTPProxy(t *testing.T) {
	r, adm, conns := httpRig(t, echoHeaders, policy.HTTPOptions{HeaderTimeout: 300 * time.Millisecond, MaxHeaderBytes: 1024})
	vip := netip.AddrPortFrom(vipV4, 80)
	open := func() (*Conn, *bufio.Reader) {
		c := dial(t, r.client, vip)
		c.SetDeadline(time.Now().Add(10 * time.Second))
		return c, bufio.NewReader(c)
	}
	read := func(br *bufio.Reader) (*http.Response, string) {
		t.Helper()
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("response: %v", err)
		}
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatalf("response body: %v", err)
		}
		return resp, string(b)
	}

	t.Run("keep-alive, hop-by-hop, X-Forwarded-For, pooled target", func(t *testing.T) {
		c, br := open()
		defer c.Close()
		for i := range 3 {
			fmt.Fprintf(c, "GET /%d HTTP/1.1\r\nHost: x\r\nConnection: X-Secret\r\nX-Secret: a\r\nKeep-Alive: 5\r\nX-Forwarded-For: 10.0.0.1\r\n\r\n", i)
			resp, body := read(br)
			if resp.StatusCode != 200 {
				t.Fatalf("request %d: %d", i, resp.StatusCode)
			}
			if strings.Contains(body, "X-Secret") || strings.Contains(body, "Keep-Alive") || strings.Contains(body, "Connection") {
				t.Errorf("hop-by-hop fields reached the target:\n%s", body)
			}
			if !strings.Contains(body, "X-Forwarded-For: 10.0.0.1, 198.18.0.2") {
				t.Errorf("X-Forwarded-For not appended:\n%s", body)
			}
		}
		if n := conns.Load(); n != 1 {
			t.Errorf("%d target connections for 3 requests on one client connection, want 1 (pooled)", n)
		}
	})
	t.Run("chunked upload streamed, Expect 100-continue", func(t *testing.T) {
		c, br := open()
		defer c.Close()
		io.WriteString(c, "POST /up HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nExpect: 100-continue\r\n\r\n")
		resp, err := http.ReadResponse(br, nil)
		if err != nil || resp.StatusCode != 100 {
			t.Fatalf("want 100 Continue before the body: %v %v", resp, err)
		}
		chunk := strings.Repeat("u", 32<<10)
		for range 32 {
			fmt.Fprintf(c, "%x\r\n%s\r\n", len(chunk), chunk)
		}
		io.WriteString(c, "0\r\n\r\n")
		resp, body := read(br)
		if resp.StatusCode != 200 || !strings.HasPrefix(body, "POST "+strconv.Itoa(32*len(chunk))+"\n") {
			t.Errorf("chunked upload: %d %q", resp.StatusCode, proxy.RequestLine([]byte(body)))
		}
	})
	t.Run("HTTP/1.0 keep-alive", func(t *testing.T) {
		c, br := open()
		defer c.Close()
		for i := range 2 {
			io.WriteString(c, "GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
			resp, _ := read(br)
			if resp.StatusCode != 200 || resp.Header.Get("Connection") != "keep-alive" || resp.ProtoMinor != 0 {
				t.Fatalf("request %d: %d %v %s", i, resp.StatusCode, resp.Header, resp.Proto)
			}
		}
		io.WriteString(c, "GET / HTTP/1.0\r\n\r\n")
		read(br)
		if _, err := br.ReadByte(); err != io.EOF {
			t.Errorf("HTTP/1.0 without keep-alive: connection not closed: %v", err)
		}
	})
	t.Run("body ended by the target's close", func(t *testing.T) {
		c, br := open()
		defer c.Close()
		io.WriteString(c, "GET /raw HTTP/1.1\r\nHost: x\r\n\r\n")
		resp, body := read(br)
		if resp.StatusCode != 200 || body != "until the close" {
			t.Errorf("close-delimited body: %d %q", resp.StatusCode, body)
		}
	})
	for _, tc := range []struct {
		name, send string
		status     int
	}{
		{"Content-Length with Transfer-Encoding", "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400},
		{"head too big", "GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("b", 2048) + "\r\n\r\n", 431},
		{"head too slow", "GET / HTTP/1.1\r\nHost: x\r\n", 408},
		{"malformed", "GET / HTTP/1.1\r\nHost x\r\n\r\n", 400},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, br := open()
			defer c.Close()
			io.WriteString(c, tc.send)
			resp, _ := read(br)
			if resp.StatusCode != tc.status {
				t.Errorf("status %d, want %d", resp.StatusCode, tc.status)
			}
			if _, err := br.ReadByte(); err != io.EOF {
				t.Errorf("connection not closed after %d: %v", tc.status, err)
			}
		})
	}
	st := r.stats()
	if st.HTTPBadRequest != 2 || st.HTTPHeaderTooBig != 1 || st.HTTPHeaderTimeout != 1 {
		t.Errorf("counters: bad %d, too big %d, timeout %d; want 2, 1, 1", st.HTTPBadRequest, st.HTTPHeaderTooBig, st.HTTPHeaderTimeout)
	}
	testutil.Within(5*time.Second, func() bool { return adm.clients.Load() == 0 })
	if n := adm.clients.Load(); n != 0 {
		t.Errorf("%d client slots still held after every client closed", n)
	}
	adm.mu.Lock()
	defer adm.mu.Unlock()
	if len(adm.bad) != 4 {
		t.Errorf("BadRequest heard %v, want 4", adm.bad)
	}
	if len(adm.reqEnds) != 3+1+3+1 {
		t.Errorf("%d request Ends, want 8 (one per admitted request)", len(adm.reqEnds))
	}
}
