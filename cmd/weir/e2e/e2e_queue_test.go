//go:build linux

package e2e

// End-to-end tests of issue 26's queue at the limit and per-client limits
// with the real binary: ab through a queue, the overflow and order of a
// short queue, a queue timeout's 503 page, and per-client connection,
// request and bandwidth limits with clients on distinct addresses (the
// namespace's loopback addresses 198.18.1.x, routed to the VIPs through
// weir's TUN).

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"weir/cmd/weir/api"
	"weir/internal/testutil"
)

// dialFrom connects from src (an address on the namespace's loopback) to
// addr: a client of its own address.
func (w *weirProc) dialFrom(src, addr string) (net.Conn, error) {
	var c net.Conn
	err := w.ns.Do(func() (err error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
		c, err = d.DialContext(ctx, "tcp", addr)
		return err
	})
	return c, err
}

// httpFrom is an http.Client whose connections come from src, one per
// request (no keep-alive).
func (w *weirProc) httpFrom(src string) *http.Client {
	return &http.Client{Timeout: 15 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			return w.dialFrom(src, addr)
		},
	}}
}

// get fetches url and returns the status and body.
func get(t *testing.T, c *http.Client, url string) (int, string) {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: body: %v", url, err)
	}
	return resp.StatusCode, string(b)
}

// gatedBackend is an http backend whose requests for /hold/NAME wait
// until the test opens that gate; it records the order requests arrive
// and the most in progress at once.
type gatedBackend struct {
	mu      sync.Mutex
	gates   map[string]chan struct{}
	order   []string
	active  int
	maxSeen int
}

func (g *gatedBackend) gate(name string) chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.gates == nil {
		g.gates = map[string]chan struct{}{}
	}
	c := g.gates[name]
	if c == nil {
		c = make(chan struct{})
		g.gates[name] = c
	}
	return c
}

func (g *gatedBackend) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	name := strings.TrimPrefix(r.URL.Path, "/hold/")
	g.mu.Lock()
	g.order = append(g.order, name)
	g.active++
	g.maxSeen = max(g.maxSeen, g.active)
	g.mu.Unlock()
	if strings.HasPrefix(r.URL.Path, "/hold/") {
		<-g.gate(name)
	}
	g.mu.Lock()
	g.active--
	g.mu.Unlock()
	fmt.Fprintf(rw, "served %s\n", name)
}

func (g *gatedBackend) arrived() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]string(nil), g.order...)
}

func (w *weirProc) gated(addr string) *gatedBackend {
	w.t.Helper()
	g := &gatedBackend{}
	srv := &http.Server{Handler: g, ReadHeaderTimeout: 5 * time.Second}
	ln := w.listen(addr)
	go srv.Serve(ln)
	w.t.Cleanup(func() {
		g.mu.Lock()
		for _, c := range g.gates {
			select {
			case <-c:
			default:
				close(c)
			}
		}
		g.mu.Unlock()
		srv.Close()
	})
	return g
}

func levelQueue(st api.Status, name string) api.Queue {
	if l := statusLevel(st, "virtual server", name); l != nil && l.Queue != nil {
		return *l.Queue
	}
	return api.Queue{}
}

var abMean = regexp.MustCompile(`(?m)^Time per request:\s+([\d.]+) \[ms\] \(mean\)`)

// TestE2EQueueAB: ab -c 10 at maxConnections 2 with a queue of 8 (2 s)
// and a backend holding each request 200 ms: no request is refused, the
// backend never has more than 2 at once, and every request but the first
// two of each round waited in the queue.
func TestE2EQueueAB(t *testing.T) {
	access := filepath.Join(t.TempDir(), "access.log")
	w := startWeir(t, "queue.yaml", "--access-log", access)
	b := w.backend("t1", "198.18.1.1:8081", 200*time.Millisecond)
	start := time.Now()
	r := w.ab("-c", "10", "-n", "60", "http://198.18.0.40/")
	took := time.Since(start)
	st := w.status()
	q := levelQueue(st, "q8")
	mean := "?"
	if m := abMean.FindStringSubmatch(r.out); m != nil {
		mean = m[1]
	}
	// 60 requests through 2 slots of 200 ms: 6 s at best; ab's mean time
	// per request at -c 10 is then 10/2 × 200 ms = 1000 ms.
	t.Logf("ab -c 10 -n 60: complete %d, failed %d, non-2xx %d in %v (ideal 6s); mean %s ms per request (ideal 1000); backend peak %d; queue %+v",
		r.complete, r.failed, r.non2xx, took.Round(time.Millisecond), mean, b.MaxActive(), q)
	if r.complete != 60 || r.failed != 0 || r.non2xx != 0 {
		t.Errorf("complete %d failed %d non-2xx %d, want 60, 0, 0: none refused\n%s", r.complete, r.failed, r.non2xx, r.out)
	}
	if b.MaxActive() != 2 {
		t.Errorf("backend peak %d, want 2", b.MaxActive())
	}
	if n := refusalCount(st, "virtual server", "maxConnections"); n != 0 {
		t.Errorf("%d refusals", n)
	}
	if q.Limit != 8 || q.Waits < 40 || q.Served != q.Waits || q.TimedOut != 0 || q.Full != 0 || q.Waiting != 0 {
		t.Errorf("queue %+v, want ≥ 40 waits, all served, none timed out or full", q)
	}
	if q.Waits > 0 {
		t.Logf("mean queue wait %v over %d waits", time.Duration(q.WaitedSec/float64(q.Waits)*float64(time.Second)).Round(time.Millisecond), q.Waits)
	}
	// The metrics and the access log carry the queue.
	if v := metricSum(w.metrics(), "weir_queue_waits_total", map[string]string{"level": "virtual server", "name": "q8"}); v != float64(q.Waits) {
		t.Errorf("weir_queue_waits_total %v, want %d", v, q.Waits)
	}
	w.signal(os.Interrupt)
	if _, err := w.Wait(10 * time.Second); err != nil {
		t.Fatalf("weir did not exit on SIGINT: %v", err)
	}
	queued := 0
	for _, rec := range accessRecords(t, access) {
		if v, ok := rec["queue_wait_ms"].(float64); ok && v > 0 {
			queued++
		}
	}
	if uint64(queued) != q.Waits {
		t.Errorf("%d access-log lines with queue_wait_ms, want %d (the waits)", queued, q.Waits)
	}
}

// TestE2EQueueOverflowAndOrder: at maxConnections 2 with a queue of 2,
// two requests held, two queued: a fifth is refused at once with the page
// saying the queue is full; each slot freed goes to the longest waiter;
// and a request that waits past queueTimeout (1 s) gets the 503 page
// naming the limit and the wait.
func TestE2EQueueOverflowAndOrder(t *testing.T) {
	w := startWeir(t, "queue.yaml")
	g := w.gated("198.18.1.2:8082")
	c := w.httpFrom("198.18.1.1")
	type res struct {
		name   string
		status int
		body   string
		took   time.Duration
	}
	results := make(chan res, 8)
	fetch := func(name string) {
		go func() {
			start := time.Now()
			resp, err := c.Get("http://198.18.0.41/hold/" + name)
			if err != nil {
				results <- res{name, 0, err.Error(), time.Since(start)}
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			results <- res{name, resp.StatusCode, string(b), time.Since(start)}
		}()
	}
	waitArrived := func(n int) {
		t.Helper()
		if !testutil.WithinEvery(10*time.Second, 10*time.Millisecond, func() bool { return len(g.arrived()) >= n }) {
			t.Fatalf("%d requests at the backend, want %d: %v", len(g.arrived()), n, g.arrived())
		}
	}
	waitQueued := func(n int64) {
		t.Helper()
		w.waitStatus(10*time.Second, fmt.Sprintf("%d waiting in q2's queue", n), func(st api.Status) bool { return levelQueue(st, "q2").Waiting == n })
	}
	fetch("a")
	fetch("b")
	waitArrived(2)
	fetch("q1")
	waitQueued(1)
	fetch("q2")
	waitQueued(2)
	// The queue is full: refused at once.
	start := time.Now()
	status, body := get(t, c, "http://198.18.0.41/hold/over")
	if d := time.Since(start); status != 503 || !strings.Contains(body, "queue full (2 waiting)") || d > 900*time.Millisecond {
		t.Fatalf("fifth request: %d after %v, want 503 at once naming the full queue:\n%s", status, d, body)
	}
	// One slot at a time: q1 first, then q2.
	close(g.gate("a"))
	waitArrived(3)
	waitQueued(1) // q2 still waits: the freed slot went to q1 alone
	close(g.gate("b"))
	waitArrived(4)
	close(g.gate("q1"))
	close(g.gate("q2"))
	// a and b were sent at once; q1 joined the queue before q2.
	if got := g.arrived(); strings.Join(got[2:], ",") != "q1,q2" {
		t.Errorf("arrival order %v, want a and b, then q1, q2", got)
	}
	for i := 0; i < 4; i++ {
		r := <-results
		if r.status != 200 {
			t.Errorf("%s: %d %s", r.name, r.status, r.body)
		}
	}
	// A wait past queueTimeout: two held again, a third waits 1 s.
	fetch("c")
	fetch("d")
	waitArrived(6)
	start = time.Now()
	status, body = get(t, c, "http://198.18.0.41/hold/late")
	took := time.Since(start)
	t.Logf("timed-out request: %d after %v", status, took.Round(time.Millisecond))
	if status != 503 || took < time.Second || !strings.Contains(body, `virtual server &#34;q2&#34;: maxConnections 2 reached (2 open); waited 1s in the queue`) {
		t.Errorf("timed-out request: %d after %v, want 503 after 1 s naming the limit and the wait:\n%s", status, took, body)
	}
	close(g.gate("c"))
	close(g.gate("d"))
	for i := 0; i < 2; i++ {
		if r := <-results; r.status != 200 {
			t.Errorf("%s: %d %s", r.name, r.status, r.body)
		}
	}
	q := levelQueue(w.status(), "q2")
	if q.Waits != 3 || q.Served != 2 || q.TimedOut != 1 || q.Full != 1 {
		t.Errorf("queue %+v, want 3 waits, 2 served, 1 timed out, 1 full", q)
	}
}

// refusedTCP reports whether err is the RST of a refused connection (or
// its EOF, when the close got there first).
func refusedTCP(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, io.EOF)
}

// TestE2EClientMaxConnections: a tcp service with clientLimits
// maxConnections 2: client A's third connection is reset while client B
// is served, and the log line names client A; when one of A's connections
// closes, A connects again.
func TestE2EClientMaxConnections(t *testing.T) {
	w := startWeir(t, "queue.yaml")
	w.echo("198.18.1.3:8083")
	echo := func(c net.Conn) error {
		c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.WriteString(c, "hi\n"); err != nil {
			return err
		}
		buf := make([]byte, 3)
		_, err := io.ReadFull(c, buf)
		return err
	}
	var a []net.Conn
	for i := 0; i < 2; i++ {
		c, err := w.dialFrom("198.18.1.1", "198.18.0.42:80")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if err := echo(c); err != nil {
			t.Fatalf("A's connection %d: %v", i, err)
		}
		a = append(a, c)
	}
	third, err := w.dialFrom("198.18.1.1", "198.18.0.42:80")
	if err != nil {
		t.Fatal(err)
	}
	defer third.Close()
	if err := echo(third); !refusedTCP(err) {
		t.Fatalf("A's third connection: %v, want reset", err)
	}
	bc, err := w.dialFrom("198.18.1.2", "198.18.0.42:80")
	if err != nil {
		t.Fatal(err)
	}
	defer bc.Close()
	if err := echo(bc); err != nil {
		t.Fatalf("client B: %v", err)
	}
	if _, ok := w.waitLog(5*time.Second, "client 198.18.1.1: maxConnections 2 reached (2 open)"); !ok {
		t.Error("no log line naming client 198.18.1.1")
	}
	st := w.status()
	if n := refusalCount(st, "client", "maxConnections"); n != 1 {
		t.Errorf("%d client refusals, want 1", n)
	}
	a[0].Close()
	w.waitStatus(5*time.Second, "A's closed connection released", func(st api.Status) bool {
		for _, ct := range st.Clients {
			if ct.Scope == "perclient" {
				return ct.Active == 2 // A (one left) and B
			}
		}
		return false
	})
	again, err := w.dialFrom("198.18.1.1", "198.18.0.42:80")
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	if err := echo(again); err != nil {
		t.Fatalf("A after one of its connections closed: %v", err)
	}
}

// TestE2EClientRequestsInFlight: an http service with clientLimits
// maxConnections 1 counts requests in flight per client: client A's
// second request while its first is held gets the 503 page naming the
// client; client B's is served.
func TestE2EClientRequestsInFlight(t *testing.T) {
	w := startWeir(t, "queue.yaml")
	g := w.gated("198.18.1.3:8084")
	a, b := w.httpFrom("198.18.1.1"), w.httpFrom("198.18.1.2")
	done := make(chan int, 2)
	go func() {
		resp, err := a.Get("http://198.18.0.43/hold/a1")
		if err != nil {
			done <- 0
			return
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		done <- resp.StatusCode
	}()
	if !testutil.WithinEvery(10*time.Second, 10*time.Millisecond, func() bool { return len(g.arrived()) == 1 }) {
		t.Fatal("A's first request never reached the backend")
	}
	status, body := get(t, a, "http://198.18.0.43/x")
	if status != 503 || !strings.Contains(body, "client 198.18.1.1: maxConnections 1 reached (1 open)") {
		t.Fatalf("A's second request: %d, want 503 naming the client:\n%s", status, body)
	}
	if status, body := get(t, b, "http://198.18.0.43/y"); status != 200 {
		t.Fatalf("client B: %d %s", status, body)
	}
	close(g.gate("a1"))
	if s := <-done; s != 200 {
		t.Fatalf("A's first request: %d", s)
	}
	if status, _ := get(t, a, "http://198.18.0.43/z"); status != 200 {
		t.Fatalf("A after its request ended: %d", status)
	}
}

// TestE2EClientBandwidth: per-client bandwidth with Sun's window
// semantics (metricInterval 3 s): a client that downloaded 1 MB is over
// 100 kB/s for the window's length and its new requests get the 503 page
// naming it, while client B is served; once its bytes are older than the
// window it is served again.
func TestE2EClientBandwidth(t *testing.T) {
	w := startWeir(t, "queue.yaml")
	w.t.Helper()
	big := strings.Repeat("x", 1<<20)
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/big" {
			io.WriteString(rw, big)
			return
		}
		io.WriteString(rw, "small\n")
	})}
	ln := w.listen("198.18.1.3:8085")
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	a, b := w.httpFrom("198.18.1.1"), w.httpFrom("198.18.1.2")
	if status, body := get(t, a, "http://198.18.0.44/big"); status != 200 || len(body) != 1<<20 {
		t.Fatalf("A's download: %d, %d bytes", status, len(body))
	}
	downloaded := time.Now()
	// 1 MiB over 3 s is ~350 kB/s: over 100 kB/s from the next recompute.
	var status int
	var body string
	if !testutil.WithinEvery(2*time.Second, 20*time.Millisecond, func() bool {
		status, body = get(t, a, "http://198.18.0.44/small")
		return status == 503
	}) {
		t.Fatalf("A never refused after 1 MiB in a 3 s window: %d", status)
	}
	if !strings.Contains(body, "client 198.18.1.1: maxBandwidth 100000 B/s exceeded (measured ") {
		t.Errorf("the page does not name client A's bandwidth:\n%s", body)
	}
	if s, _ := get(t, b, "http://198.18.0.44/small"); s != 200 {
		t.Errorf("client B: %d", s)
	}
	// Served again once the download is out of the window, not before.
	var back time.Duration
	if !testutil.WithinEvery(8*time.Second, 50*time.Millisecond, func() bool {
		s, _ := get(t, b, "http://198.18.0.44/small") // B keeps its own window low
		_ = s
		if s, _ := get(t, a, "http://198.18.0.44/small"); s == 200 {
			back = time.Since(downloaded)
			return true
		}
		return false
	}) {
		t.Fatal("A never served again")
	}
	t.Logf("client A refused for %v after its 1 MiB download (window 3 s)", back.Round(time.Millisecond))
	if back < 2*time.Second {
		t.Errorf("A served again after %v: the 3 s window still holds most of its download", back)
	}
}
