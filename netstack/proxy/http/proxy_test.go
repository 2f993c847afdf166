package http_test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"weir/internal/testutil"
	"weir/netstack/proxy"
	proxyhttp "weir/netstack/proxy/http"
	"weir/netstack/proxy/proxytest"
	"weir/policy"
)

// TestMain fails the package if a test leaves a goroutine running.
func TestMain(m *testing.M) { testutil.VerifyNoLeaks(m) }

// reqAdmitter admits every client and every request to its target but
// those for /refuse (503); its sessions keep each request's End and the
// bytes Moved reported.
type reqAdmitter struct {
	target   *policy.Target
	released atomic.Int64 // AdmitClient releases called

	mu    sync.Mutex
	ends  []proxy.End // protected by mu
	moved []int64     // protected by mu: payload bytes per request, in order
}

func (a *reqAdmitter) AdmitClient(*proxy.ConnRequest) (proxy.Decision, func()) {
	return proxy.Decision{Verdict: proxy.Accept}, func() { a.released.Add(1) }
}

func (a *reqAdmitter) AdmitRequest(_ *proxy.ConnRequest, r *proxy.Request) (proxy.Decision, proxy.RequestSession) {
	a.mu.Lock()
	i := len(a.moved)
	a.moved = append(a.moved, 0)
	a.mu.Unlock()
	s := &reqSession{a: a, i: i}
	if strings.Contains(r.Line, "/refuse") {
		return proxy.Decision{Verdict: proxy.Refuse503, Limit: "maxConnections", Value: 1, Reason: "full"}, s
	}
	return proxy.Decision{Verdict: proxy.Accept, Target: a.target}, s
}

func (a *reqAdmitter) BadRequest(*proxy.ConnRequest, *proxy.RequestEnd) {}

type reqSession struct {
	a *reqAdmitter
	i int
}

func (s *reqSession) DialFailed(proxy.Decision, error) proxy.Decision {
	return proxy.Decision{Verdict: proxy.Refuse503}
}
func (s *reqSession) TargetFailed(proxy.Decision, error) {}
func (*reqSession) Spliced(int64)                        {}
func (s *reqSession) Released()                          {}
func (s *reqSession) Moved(payload, _ int64) {
	s.a.mu.Lock()
	s.a.moved[s.i] += payload
	s.a.mu.Unlock()
}
func (s *reqSession) End(e *proxy.End) {
	s.a.mu.Lock()
	s.a.ends = append(s.a.ends, *e)
	s.a.mu.Unlock()
}

// TestKeepAliveOverPipes drives the request proxy with no stack: a client
// connection and the target connections are in-memory pipes, the target an
// http.Server. One client connection carries a GET, a 100 KiB upload, a
// request refused with the 503 page (the connection stays open) and a GET
// with Connection: close; the admitted ones share one pooled target
// connection, each reports its own bytes, and the counters add up.
func TestKeepAliveOverPipes(t *testing.T) {
	targets := proxytest.NewListener()
	var served atomic.Int64
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		served.Add(1)
		fmt.Fprintf(w, "%s %s %d", r.Method, r.URL.Path, n)
	})}
	srvDone := make(chan struct{})
	go func() { defer close(srvDone); _ = srv.Serve(targets) }()
	defer func() { srv.Close(); <-srvDone }()

	cfg, err := policy.Compile(&policy.Config{Services: []*policy.VirtualServer{{
		Name: "web", Proto: policy.ProtoHTTP, VIPs: []netip.Addr{netip.MustParseAddr("198.19.0.80")}, Ports: policy.PortRange{Lo: 80, Hi: 80},
		Targets: []*policy.Target{{Name: "a", Addr: netip.MustParseAddrPort("198.18.0.10:80"), Weight: 1}},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	vs := cfg.Services[0]
	adm := &reqAdmitter{target: vs.Targets[0]}
	hs := proxyhttp.New(proxyhttp.Options{RequestAdmitter: adm})
	// The target is via: host; its dials are the pipes targets accepts
	// (a Decision's own Dialer would bypass the pool).
	p := proxy.New(proxy.Options{HTTP: hs, Host: targets})
	near, client := proxytest.Pipe()
	served1 := make(chan struct{})
	go func() {
		defer close(served1)
		p.HandleConn(near, &proxy.ConnRequest{Client: netip.MustParseAddrPort("198.18.0.2:40000"), VIP: netip.AddrPortFrom(vs.VIPs[0], 80), Service: vs})
	}()

	br := bufio.NewReader(client)
	do := func(req string) *http.Response {
		t.Helper()
		_ = client.SetDeadline(time.Now().Add(10 * time.Second))
		errc := make(chan error, 1)
		go func() { _, err := io.WriteString(client, req); errc <- err }()
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("%v; proxy %+v, http %+v, ends %+v", err, p.Stats(), hs.Stats(), adm.ends)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body = io.NopCloser(bytes.NewReader(body))
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
		return resp
	}
	body := func(r *http.Response) string { b, _ := io.ReadAll(r.Body); return string(b) }

	if r := do("GET /one HTTP/1.1\r\nHost: web\r\n\r\n"); r.StatusCode != 200 || body(r) != "GET /one 0" {
		t.Fatalf("first GET: %d", r.StatusCode)
	}
	upload := strings.Repeat("u", 100<<10)
	if r := do(fmt.Sprintf("POST /up HTTP/1.1\r\nHost: web\r\nContent-Length: %d\r\n\r\n%s", len(upload), upload)); r.StatusCode != 200 || body(r) != fmt.Sprintf("POST /up %d", len(upload)) {
		t.Fatalf("upload: %d", r.StatusCode)
	}
	if r := do("GET /refuse HTTP/1.1\r\nHost: web\r\n\r\n"); r.StatusCode != 503 || r.Close {
		t.Fatalf("refused: %d, close %v; want 503 on a kept connection", r.StatusCode, r.Close)
	}
	if r := do("GET /last HTTP/1.1\r\nHost: web\r\n\r\n"); r.StatusCode != 200 || r.Close || body(r) != "GET /last 0" {
		t.Fatalf("last GET: %d, close %v", r.StatusCode, r.Close)
	}
	// The client closes; the target connection stays in the pool.
	client.Close()
	<-served1

	if served.Load() != 3 || adm.released.Load() != 1 {
		t.Errorf("target served %d, client released %d; want 3, 1", served.Load(), adm.released.Load())
	}
	st, ps := hs.Stats(), p.Stats()
	if st.Requests != 4 || st.Refused != 1 || st.Clients != 0 || st.TargetConns != 1 || st.TargetConnsIdle != 1 || ps.Accepted != 1 || ps.Refused503 != 1 {
		t.Errorf("stats %+v, proxy %+v; want 4 requests, 1 refused, 1 pooled target connection", st, ps)
	}
	adm.mu.Lock()
	ends, moved := append([]proxy.End(nil), adm.ends...), append([]int64(nil), adm.moved...)
	adm.mu.Unlock()
	if len(ends) != 4 {
		t.Fatalf("%d Ends, want 4", len(ends))
	}
	for i, e := range ends {
		want := []proxy.Outcome{proxy.Served, proxy.Served, proxy.RefusedPage, proxy.Served}[i]
		if e.Outcome != want || e.Request == nil {
			t.Errorf("request %d: %v %+v, want %v", i+1, e.Outcome, e.Request, want)
			continue
		}
		// The three admitted requests went over the one pooled target
		// connection (the first dialed it).
		if reused := e.Request.Reused; e.Outcome == proxy.Served && reused != (i > 0) {
			t.Errorf("request %d reused %v", i+1, reused)
		}
	}
	// Each admitted request reported its own bytes, the upload its body
	// too; the refused one nothing.
	if moved[1] < int64(len(upload)) || moved[0] == 0 || moved[3] == 0 || moved[2] != 0 {
		t.Errorf("bytes moved per request %v: want the upload's ≥ %d, the refused one's 0", moved, len(upload))
	}
	// The pooled target connection is the proxy's to sample: its bytes
	// are the target's, and Close ends it.
	s := p.Sample()
	if len(s.Targets) != 1 || s.Targets[0].Bytes < uint64(len(upload)) {
		t.Errorf("sample %+v, want the target's bytes", s.Targets)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if st := hs.Stats(); st.TargetConns != 0 || st.TargetConnsIdle != 0 {
		t.Errorf("after Close: %+v, want no target connection", st)
	}
}
