package health

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"regexp"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"weir/balancer"
	"weir/policy"
)

// statusServer is a real HTTP server on loopback answering /healthz with
// the status held in code, and 404 elsewhere; it records each request's
// method and Host.
type statusServer struct {
	*httptest.Server
	code atomic.Int32
	mu   sync.Mutex
	seen []string // "METHOD host path"
}

func newStatusServer(t *testing.T, code int) *statusServer {
	s := &statusServer{}
	s.code.Store(int32(code))
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.seen = append(s.seen, r.Method+" "+r.Host+" "+r.URL.Path)
		s.mu.Unlock()
		if r.URL.Path != "/healthz" {
			w.WriteHeader(http.StatusNotFound)
			return
		}
		w.WriteHeader(int(s.code.Load()))
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *statusServer) addr() netip.AddrPort {
	return s.Listener.Addr().(*net.TCPAddr).AddrPort()
}

// rawServer accepts connections on loopback and runs serve on each; it
// closes them all at cleanup.
func rawServer(t *testing.T, serve func(c net.Conn)) netip.AddrPort {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() { serve(c) })
		}
	})
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().(*net.TCPAddr).AddrPort()
}

// hold keeps the connection open, reading and discarding, until the peer
// or the cleanup closes it: a port that accepts but never answers.
func hold(c net.Conn) { io.Copy(io.Discard, c) }

// banner writes b, then holds the connection.
func banner(b string) func(net.Conn) {
	return func(c net.Conn) {
		io.WriteString(c, b)
		hold(c)
	}
}

func (r *rig) check(name string) *balancer.CheckStatus {
	for _, ts := range r.b.Snapshot(t0).Targets {
		if ts.Name == name {
			return ts.Check
		}
	}
	return nil
}

// TestHTTPCheck503DownAndBack: a target answering 503 on /healthz fails
// each check with reason "status 503", counting toward fall; it is down
// after fall rounds and back after rise rounds of 200.
func TestHTTPCheck503DownAndBack(t *testing.T) {
	srv := newStatusServer(t, 200)
	r := newRig(t, policy.HealthCheck{Interval: time.Second, Timeout: 5 * time.Second, Rise: 2, Fall: 3,
		HTTP: &policy.HTTPCheck{Path: "/healthz", Host: "svc.example"}}, nil,
		&policy.Target{Name: "a", Addr: srv.addr(), Weight: 1})
	ctx := context.Background()
	step := func(what string, up, ok bool, reason string, streak, need int) {
		t.Helper()
		r.c.CheckOnce(ctx)
		c := r.check("a")
		if got := r.up()[0]; got != up || c == nil || c.OK != ok || c.Reason != reason || c.Streak != streak || c.Need != need {
			t.Fatalf("%s: up %v, check %+v; want up %v ok %v reason %q streak %d/%d", what, got, c, up, ok, reason, streak, need)
		}
	}
	step("200", true, true, "", 0, 3)
	srv.code.Store(503)
	step("503, 1", true, false, "status 503", 1, 3)
	step("503, 2", true, false, "status 503", 2, 3)
	step("503, 3", false, false, "status 503", 0, 2)
	step("503, down", false, false, "status 503", 0, 2)
	srv.code.Store(200)
	step("200, 1", false, true, "", 1, 2)
	step("200, 2", true, true, "", 0, 3)
	srv.mu.Lock()
	defer srv.mu.Unlock()
	if len(srv.seen) != 7 || srv.seen[0] != "GET svc.example /healthz" {
		t.Errorf("requests %q, want 7 of GET svc.example /healthz", srv.seen)
	}
}

// TestHTTPCheckStatusRangeAndDefaults: the passing range is configurable;
// with no Host the target's address is sent; HEAD is sent as HEAD.
func TestHTTPCheckStatusRangeAndDefaults(t *testing.T) {
	srv := newStatusServer(t, 204)
	tg := Target{Name: "a", Addr: srv.addr()}
	hc := func(x policy.HTTPCheck) *policy.HealthCheck {
		h := &policy.HealthCheck{Interval: time.Second, HTTP: &x}
		cfg, err := policy.Compile(&policy.Config{Balancer: policy.BalancerSettings{Health: *h}})
		if err != nil {
			t.Fatal(err)
		}
		return &cfg.Balancer.Health
	}
	if r := Check(context.Background(), tg, hc(policy.HTTPCheck{Path: "/healthz"})); !r.OK {
		t.Errorf("204 with the default 200-399: %+v", r)
	}
	if r := Check(context.Background(), tg, hc(policy.HTTPCheck{Path: "/healthz", Status: policy.StatusRange{Lo: 200, Hi: 200}})); r.OK || r.Reason != "status 204" {
		t.Errorf("204 with 200 only: %+v, want status 204", r)
	}
	if r := Check(context.Background(), tg, hc(policy.HTTPCheck{Method: "HEAD"})); r.OK || r.Reason != "status 404" {
		t.Errorf("HEAD / : %+v, want status 404", r)
	}
	srv.mu.Lock()
	defer srv.mu.Unlock()
	if want := "HEAD " + srv.addr().String() + " /"; len(srv.seen) != 3 || srv.seen[2] != want {
		t.Errorf("requests %q, the last want %q", srv.seen, want)
	}
}

// TestExpectReasons: each failure names its reason; the bytes and regexp
// forms pass a matching answer.
func TestExpectReasons(t *testing.T) {
	silent := rawServer(t, hold)
	smtp := rawServer(t, banner("220 mx.example ESMTP ready\r\n"))
	pong := rawServer(t, func(c net.Conn) {
		buf := make([]byte, 6)
		if _, err := io.ReadFull(c, buf); err == nil && string(buf) == "PING\r\n" {
			io.WriteString(c, "+PONG\r\n")
		} else {
			io.WriteString(c, "-ERR\r\n")
		}
		hold(c)
	})
	closer := rawServer(t, func(c net.Conn) { io.WriteString(c, "22"); c.Close() })
	notHTTP := rawServer(t, banner("SSH-2.0-OpenSSH_9.6\r\n"))
	dead := deadAddr(t)
	const timeout = 100 * time.Millisecond
	h := func(f func(*policy.HealthCheck)) *policy.HealthCheck {
		x := &policy.HealthCheck{Interval: time.Second, Timeout: timeout}
		f(x)
		return x
	}
	re := regexp.MustCompile
	tests := []struct {
		name   string
		addr   netip.AddrPort
		h      *policy.HealthCheck
		ok     bool
		reason string
	}{
		{"connect only", silent, h(func(*policy.HealthCheck) {}), true, ""},
		{"refused", dead, h(func(*policy.HealthCheck) {}), false, ReasonRefused},
		{"silent port, bytes", silent, h(func(x *policy.HealthCheck) { x.Expect = "220" }), false, ReasonTimeout},
		{"silent port, regexp", silent, h(func(x *policy.HealthCheck) { x.ExpectRegexp = re("^220") }), false, ReasonTimeout},
		{"silent port, http", silent, h(func(x *policy.HealthCheck) { x.HTTP = &policy.HTTPCheck{Method: "GET", Path: "/"} }), false, ReasonTimeout},
		{"banner bytes match", smtp, h(func(x *policy.HealthCheck) { x.Expect = "220 " }), true, ""},
		{"banner bytes mismatch", smtp, h(func(x *policy.HealthCheck) { x.Expect = "SSH-2.0" }), false, ReasonMismatch},
		{"banner regexp match", smtp, h(func(x *policy.HealthCheck) { x.ExpectRegexp = re(`^220 \S+ ESMTP`) }), true, ""},
		{"banner regexp mismatch, held open", smtp, h(func(x *policy.HealthCheck) { x.ExpectRegexp = re(`^SSH-2\.0-`) }), false, ReasonMismatch},
		{"send/expect", pong, h(func(x *policy.HealthCheck) { x.Send, x.Expect = "PING\r\n", "+PONG" }), true, ""},
		{"send/expect wrong answer", pong, h(func(x *policy.HealthCheck) { x.Send, x.Expect = "PINK\r\n", "+PONG" }), false, ReasonMismatch},
		{"closed before the whole expect", closer, h(func(x *policy.HealthCheck) { x.Expect = "220" }), false, ReasonClosed},
		{"closed after a regexp mismatch", closer, h(func(x *policy.HealthCheck) { x.ExpectRegexp = re("^3") }), false, ReasonMismatch},
		{"not http", notHTTP, h(func(x *policy.HealthCheck) { x.HTTP = &policy.HTTPCheck{Method: "GET", Path: "/"} }), false, ReasonBadReply},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			start := time.Now()
			r := Check(context.Background(), Target{Name: "x", Addr: tt.addr}, tt.h)
			if r.OK != tt.ok || r.Reason != tt.reason {
				t.Errorf("Check = %+v, want ok %v reason %q", r, tt.ok, tt.reason)
			}
			if tt.reason == ReasonTimeout && time.Since(start) < timeout {
				t.Errorf("timed out after %v, before the timeout %v", time.Since(start), timeout)
			}
		})
	}
}

// TestLoopMarksA503TargetDownInTime: the loop's rounds take a target that
// starts answering 503 out within fall × interval (plus the round the
// change fell in), and bring it back after rise rounds of 200.
func TestLoopMarksA503TargetDownInTime(t *testing.T) {
	if testing.Short() {
		t.Skip("timing-bound: runs the checker's loop on the real clock")
	}
	const interval, fall, rise = 50 * time.Millisecond, 3, 2
	srv := newStatusServer(t, 200)
	r := newRig(t, policy.HealthCheck{Interval: interval, Timeout: interval / 2, Rise: rise, Fall: fall, HTTP: &policy.HTTPCheck{Path: "/healthz"}}, nil,
		&policy.Target{Name: "a", Addr: srv.addr(), Weight: 1})
	// changed receives each change of the balancer's verdict, sent from
	// the report that made it (one target: the reports come one at a time).
	changed := make(chan bool, 16)
	report, last := r.c.Report, false // false: the first report sends the state it found (up)
	r.c.Report = func(name string, res Result, now time.Time) {
		report(name, res, now)
		if up := r.up()[0]; up != last || now.IsZero() {
			last = up
			changed <- up
		}
	}
	r.c.Now = time.Now
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.c.Loop(ctx) }()
	defer func() { cancel(); <-done }()
	if !<-changed {
		t.Fatal("first verdict not up")
	}
	wait := func(want bool) time.Duration {
		start := time.Now()
		for v := range changed {
			if v == want {
				break
			}
		}
		return time.Since(start)
	}
	srv.code.Store(503)
	down := wait(false)
	srv.code.Store(200)
	up := wait(true)
	t.Logf("503 marked down after %v (fall %d × interval %v = %v); 200 back after %v (rise %d)", down, fall, interval, fall*interval, up, rise)
	if bound := (fall + 1) * interval; down > bound+interval/2 {
		t.Errorf("marked down after %v, want within %v", down, bound)
	}
}
