//go:build linux

package e2e

// End-to-end tests of issue 11 with the real binary and ApacheBench (ab,
// from apache2-utils: scripts/deps.sh installs it): http services admit,
// count and route each request; tcp services free a connection's slot once
// the client has seen it closed.

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"weir/bench"
	"weir/cmd/weir/api"
)

// abResult is what the tests read of an ab run.
type abResult struct {
	complete, failed, non2xx int
	out                      string
}

var abNum = regexp.MustCompile(`(?m)^(Complete requests|Failed requests|Non-2xx responses):\s+(\d+)`)

// ab runs ApacheBench inside weir's namespace against url.
func (w *weirProc) ab(args ...string) abResult {
	w.t.Helper()
	path, err := exec.LookPath("ab")
	if err != nil {
		w.t.Skip("skipping: ab (apache2-utils) is not installed; scripts/deps.sh installs it")
	}
	var out []byte
	err = w.ns.Do(func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
		defer cancel()
		var err error
		out, err = exec.CommandContext(ctx, path, append([]string{"-q", "-s", "10"}, args...)...).CombinedOutput()
		return err
	})
	if err != nil {
		w.t.Fatalf("ab %v: %v\n%s", args, err, out)
	}
	r := abResult{out: string(out)}
	for _, m := range abNum.FindAllStringSubmatch(r.out, -1) {
		n, _ := strconv.Atoi(m[2])
		switch m[1] {
		case "Complete requests":
			r.complete = n
		case "Failed requests":
			r.failed = n
		case "Non-2xx responses":
			r.non2xx = n
		}
	}
	return r
}

// TestE2ESequentialABNeverRefused: at maxConnections 1 a client that sends
// one request at a time is never refused, on a new connection per request
// (the slot is free before weir's FIN), on one keep-alive connection (the
// request slot is free before the next request is read), and on a tcp
// service (the slot is free once the client has seen both FINs).
func TestE2ESequentialABNeverRefused(t *testing.T) {
	w := startWeir(t, "requests.yaml")
	w.backend("t3", "198.18.1.3:8083", 0)
	w.backend("t4", "198.18.1.3:8084", 0)
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"http, a connection per request", []string{"-c", "1", "-n", "200", "http://198.18.0.31/"}},
		{"http, keep-alive", []string{"-k", "-c", "1", "-n", "200", "http://198.18.0.31/"}},
		{"tcp, a connection per request", []string{"-c", "1", "-n", "200", "http://198.18.0.32/"}},
	} {
		r := w.ab(tc.args...)
		t.Logf("%s: ab %s: complete %d, failed %d, non-2xx %d", tc.name, strings.Join(tc.args, " "), r.complete, r.failed, r.non2xx)
		if r.complete != 200 || r.failed != 0 || r.non2xx != 0 {
			t.Errorf("%s: complete %d failed %d non-2xx %d, want 200, 0, 0\n%s", tc.name, r.complete, r.failed, r.non2xx, r.out)
		}
	}
	st := w.status()
	if n := refusalCount(st, "virtual server", "maxConnections"); n != 0 {
		t.Errorf("%d refusals by the service's maxConnections 1", n)
	}
	if s := statusService(st, "raw"); s == nil || s.Refused != 0 {
		t.Errorf("tcp service refused with its target at maxConnections 1: %+v", s)
	}
}

// TestE2EPendingRequests is the plug-in's example with ab -k: members
// taking 2 and 5 requests in flight, each request held 300 ms, 25
// concurrent keep-alive clients. The backends never see more than their
// limit at once, some requests get the 503 page naming both members at
// their limit, and both serve again at once after.
func TestE2EPendingRequests(t *testing.T) {
	w := startWeir(t, "requests.yaml")
	b1 := w.backend("t1", "198.18.1.1:8081", 300*time.Millisecond)
	b2 := w.backend("t2", "198.18.1.2:8082", 300*time.Millisecond)
	var (
		mu     sync.Mutex
		reason string
	)
	stop := make(chan struct{})
	probed := make(chan struct{})
	// The prober ends before the test does, a skip (no ab) included.
	stopProbe := sync.OnceFunc(func() { close(stop); <-probed })
	defer stopProbe()
	go func() {
		// A client of its own catches one 503 page while ab runs.
		defer close(probed)
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			res := bench.Load{Dial: w.ns.Dial, Addr: "198.18.0.30:80", Requests: 1, Duration: 5 * time.Second}.Run(context.Background())
			for r := range res.Reasons {
				mu.Lock()
				reason = r
				mu.Unlock()
				return
			}
		}
	}()
	// A refusal is answered at once, so the 25 clients send far more
	// requests than the 7 slots serve: ab runs 3 s (-t) rather than a
	// number of requests.
	r := w.ab("-k", "-c", "25", "-t", "3", "-n", "1000000", "http://198.18.0.30/")
	stopProbe()
	served := b1.Served() + b2.Served()
	t.Logf("ab -k -c 25 -t 3: complete %d, non-2xx %d, served %d (t1 %d, t2 %d); backend peaks t1 %d (max 2) t2 %d (max 5)",
		r.complete, r.non2xx, served, b1.Served(), b2.Served(), b1.MaxActive(), b2.MaxActive())
	if b1.MaxActive() > 2 || b2.MaxActive() > 5 {
		t.Errorf("backend peaks t1=%d t2=%d, want at most 2 and 5", b1.MaxActive(), b2.MaxActive())
	}
	if b1.MaxActive() < 2 || b2.MaxActive() < 5 {
		t.Errorf("backend peaks t1=%d t2=%d: the load never filled both", b1.MaxActive(), b2.MaxActive())
	}
	if r.complete == 0 || r.non2xx == 0 || r.non2xx >= r.complete {
		t.Errorf("complete %d, non-2xx %d: want some, not all, refused\n%s", r.complete, r.non2xx, r.out)
	}
	mu.Lock()
	got := reason
	mu.Unlock()
	if !strings.Contains(got, "t1 (at limit 2/2)") || !strings.Contains(got, "t2 (at limit 5/5)") {
		t.Errorf("503 reason %q does not name both members at their limit", got)
	}
	// ab has gone, but the requests it left at the backends hold their
	// slots until their responses (300 ms): once those came, every slot is
	// free (on a loaded host that can be after ab's exit, so the check
	// waits for it), and both serve again.
	inflight := func(st api.Status) (n int64) {
		for _, f := range st.HTTP.InFlight {
			n += f.InFlight
		}
		return n
	}
	w.waitStatus(5*time.Second, "the slots ab's last requests held to be free", func(st api.Status) bool { return inflight(st) == 0 })
	res := w.load("198.18.0.30:80", 2, 8)
	if res.OK != 8 || res.PerTarget["t1"] == 0 || res.PerTarget["t2"] == 0 {
		t.Errorf("after the load: %+v, want 8 OK from both members", res)
	}
	// The client has its last response before weir's account of that
	// request ends (End runs after the response's last byte is written),
	// so the count is waited for; a leaked slot never gets there.
	w.waitStatus(5*time.Second, "no request in flight after the load", func(st api.Status) bool { return inflight(st) == 0 })
}

// TestE2EIdleClientsHoldNoSlot: 50 idle keep-alive connections and 50
// slow-header clients on a service with one request slot; a real client
// keeps getting 200. The slow ones get 408 after the header timeout.
func TestE2EIdleClientsHoldNoSlot(t *testing.T) {
	w := startWeir(t, "requests.yaml")
	w.backend("t3", "198.18.1.3:8083", 0)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := range 50 {
		c, err := w.ns.Dial(ctx, "tcp", "198.18.0.31:80")
		if err != nil {
			t.Fatalf("idle client %d: %v", i, err)
		}
		conns = append(conns, c)
		// One request, then the connection stays open, idle.
		fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: one\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("idle client %d: %v %v", i, resp, err)
		}
		io.Copy(io.Discard, resp.Body)
	}
	var slow []net.Conn
	for i := range 50 {
		c, err := w.ns.Dial(ctx, "tcp", "198.18.0.31:80")
		if err != nil {
			t.Fatalf("slow client %d: %v", i, err)
		}
		conns = append(conns, c)
		slow = append(slow, c)
		io.WriteString(c, "GET / HTTP/1.1\r\nHost: o") // and no more
	}
	for i := range 10 {
		res := w.load("198.18.0.31:80", 1, 1)
		if res.OK != 1 {
			t.Fatalf("real client request %d with 100 idle and slow clients open: %+v", i, res)
		}
	}
	// The slow heads time out (headerTimeout 2s): 408, and closed.
	for i, c := range slow {
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil || resp.StatusCode != http.StatusRequestTimeout {
			t.Fatalf("slow client %d: %v %v, want 408", i, resp, err)
		}
	}
	st := w.status()
	if st.Forwarder.HTTPHeaderTimeout < 50 {
		t.Errorf("header timeouts counted %d, want 50", st.Forwarder.HTTPHeaderTimeout)
	}
	if s := statusService(st, "one"); s == nil || s.Clients < 50 {
		t.Errorf("/status clients of service one: %+v, want the 50 idle ones", s)
	}
}

// TestE2EKeepAliveOverLimitAndAccessLog: a keep-alive connection whose
// service is at its enforced limit gets a 503 for its next request, on the
// same connection, which then serves again; the access log (CLF) has
// exactly one line per request.
func TestE2EKeepAliveOverLimitAndAccessLog(t *testing.T) {
	access := filepath.Join(t.TempDir(), "access.log")
	w := startWeir(t, "requests.yaml", "--access-log", access, "--access-clf")
	w.backend("t3", "198.18.1.3:8083", 0)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := w.ns.Dial(ctx, "tcp", "198.18.0.31:80")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	get := func(path string) (int, string) {
		t.Helper()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: one\r\n\r\n", path)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, _ := get("/first"); code != 200 {
		t.Fatalf("first request: %d", code)
	}
	// Another client takes the service's one request slot and holds it.
	release := make(chan struct{})
	held := make(chan error, 1)
	go func() {
		c2, err := w.ns.Dial(ctx, "tcp", "198.18.0.31:80")
		if err != nil {
			held <- err
			return
		}
		defer c2.Close()
		// A request whose body arrives slowly: it is in flight until
		// the body is in and answered.
		fmt.Fprintf(c2, "POST /held HTTP/1.1\r\nHost: one\r\nContent-Length: 2\r\n\r\nx")
		<-release
		io.WriteString(c2, "y")
		resp, err := http.ReadResponse(bufio.NewReader(c2), nil)
		if err == nil {
			resp.Body.Close()
		}
		held <- err
	}()
	w.waitStatus(10*time.Second, "the held request counted", func(st api.Status) bool {
		l := statusLevel(st, "virtual server", "one")
		return l != nil && l.Connections == 1
	})
	code, body := get("/second")
	if code != 503 || !strings.Contains(body, "maxConnections") {
		t.Errorf("next request on the keep-alive connection over the limit: %d %q, want 503 naming maxConnections", code, body)
	}
	close(release)
	if err := <-held; err != nil {
		t.Fatalf("held request: %v", err)
	}
	if code, _ := get("/third"); code != 200 {
		t.Errorf("the same connection after the limit cleared: %d, want 200", code)
	}
	c.Close()
	// weir flushes the access log on exit.
	w.signal(os.Interrupt)
	if _, err := w.Wait(10 * time.Second); err != nil {
		t.Fatalf("weir did not exit on SIGINT: %v", err)
	}
	b, err := os.ReadFile(access)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	want := []string{`"GET /first HTTP/1.1" 200 `, `"POST /held HTTP/1.1" 200 `, `"GET /second HTTP/1.1" 503 `, `"GET /third HTTP/1.1" 200 `}
	if len(lines) != len(want) {
		t.Fatalf("access log has %d lines, want %d (one per request):\n%s", len(lines), len(want), b)
	}
	for _, wl := range want {
		if n := strings.Count(string(b), wl); n != 1 {
			t.Errorf("access log has %d lines with %s, want 1:\n%s", n, wl, b)
		}
	}
}

// rps is the "Requests per second" ab reports.
var abRPS = regexp.MustCompile(`(?m)^Requests per second:\s+([0-9.]+)`)

// cpuSeconds is a process's user+system CPU time so far.
func cpuSeconds(t *testing.T, pid int) float64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// Fields after the command's closing parenthesis: utime is the 12th,
	// stime the 13th (clock ticks, 100 a second on Linux).
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (ut + st) / 100
}

// TestE2EHTTPOverhead measures the per-request cost of weir's http proxy:
// ab -k -c 8 against the backend directly and through weir, in the same
// run, with weir's CPU seconds per request. It reports figures only (the
// machine is shared and loaded); it fails only if weir drops requests.
func TestE2EHTTPOverhead(t *testing.T) {
	if testing.Short() {
		t.Skip("skipping the overhead benchmark in -short mode")
	}
	w := startWeir(t, "requests.yaml")
	w.backend("t1", "198.18.1.1:8081", 0)
	w.backend("t2", "198.18.1.2:8082", 0)
	const n = 20000
	run := func(url string) (float64, abResult) {
		r := w.ab("-k", "-c", "8", "-n", strconv.Itoa(n), url)
		m := abRPS.FindStringSubmatch(r.out)
		if m == nil || r.complete != n {
			t.Fatalf("ab %s: %d complete\n%s", url, r.complete, r.out)
		}
		rps, _ := strconv.ParseFloat(m[1], 64)
		return rps, r
	}
	direct, _ := run("http://198.18.1.1:8081/")
	pid := w.pid()
	cpu0 := cpuSeconds(t, pid)
	via, r := run("http://198.18.0.33/")
	cpu := cpuSeconds(t, pid) - cpu0
	t.Logf("ab -k -c 8 -n %d: direct %.0f req/s, through weir %.0f req/s (%.0f %%); weir CPU %.2f s = %.1f µs per request (non-2xx %d)",
		n, direct, via, 100*via/direct, cpu, cpu/n*1e6, r.non2xx)
	if r.non2xx != 0 {
		t.Errorf("%d non-2xx through weir (no limit was in reach)", r.non2xx)
	}
}
