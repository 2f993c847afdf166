//go:build linux

package e2e

import (
	"strings"
	"testing"
	"time"

	"weir/bench"
	"weir/cmd/weir/api"
	"weir/internal/testutil"
)

// TestE2EWeightedDistribution: three targets weighted 3:2:1, one client,
// 120 requests over IPv4 and 60 over IPv6 through the TUN: smooth weighted
// round robin gives exactly 60/40/20 and 30/20/10.
func TestE2EWeightedDistribution(t *testing.T) {
	w := startWeir(t, "weights.yaml")
	w.backend("t1", "198.18.1.1:8081", 0)
	w.backend("t2", "198.18.1.2:8082", 0)
	w.backend("t3", "198.18.1.3:8083", 0)
	for _, tc := range []struct {
		vip  string
		n    int
		want map[string]int
	}{
		{"198.18.0.10:80", 120, map[string]int{"t1": 60, "t2": 40, "t3": 20}},
		{"[fd00::10]:80", 60, map[string]int{"t1": 30, "t2": 20, "t3": 10}},
	} {
		start := time.Now()
		res := w.load(tc.vip, 1, tc.n)
		t.Logf("%s: %d requests in %v: %v", tc.vip, tc.n, time.Since(start).Round(time.Millisecond), res.PerTarget)
		if res.OK != tc.n {
			t.Fatalf("%s: %d of %d OK: %+v", tc.vip, res.OK, tc.n, res)
		}
		for name, n := range tc.want {
			if res.PerTarget[name] != n {
				t.Errorf("%s: per target %v, want %v", tc.vip, res.PerTarget, tc.want)
				break
			}
		}
	}
	st := w.status()
	sum, by := pickedSum(st, "web")
	if sum != 180 || by["t1"] != 90 || by["t2"] != 60 || by["t3"] != 30 {
		t.Errorf("/status picked %v (sum %d), want t1 90, t2 60, t3 30", by, sum)
	}
}

// TestE2EMaxConnections: the WebSphere plug-in scenario through the real
// binary. Members with maxConnections 3 and 4 and 30 concurrent slow
// clients: at most 7 are served at once, the rest get a 503 naming both
// members at their limit; a tcp service whose only target is full refuses
// with RST, and accepts again once the slot is free.
func TestE2EMaxConnections(t *testing.T) {
	w := startWeir(t, "maxconn.yaml")
	hold := make(chan struct{})
	b1 := w.heldBackend("t1", "198.18.1.1:8081", 0, hold)
	b2 := w.heldBackend("t2", "198.18.1.2:8082", 0, hold)
	w.echo("198.18.1.3:2323")

	res := w.heldLoad(hold, "198.18.0.20:80", 30, 30, func() bool {
		s := statusService(w.status(), "wlm")
		return s != nil && s.Refused >= 23
	})
	t.Logf("30 clients: ok=%d 503=%d reset=%d failed=%d in %v, per target %v, reasons %v",
		res.OK, res.Refused503, res.Reset, res.Failed, res.Elapsed.Round(time.Millisecond), res.PerTarget, res.Reasons)
	if b1.MaxActive() > 3 || b2.MaxActive() > 4 {
		t.Errorf("max active t1=%d (limit 3) t2=%d (limit 4)", b1.MaxActive(), b2.MaxActive())
	}
	if res.OK != 7 || res.Refused503 != 23 {
		t.Fatalf("ok=%d 503=%d of 30, want 7 (3+4) OK and the rest 503: %+v", res.OK, res.Refused503, res)
	}
	for r := range res.Reasons {
		if !strings.Contains(r, "t1 (at limit 3/3)") || !strings.Contains(r, "t2 (at limit 4/4)") {
			t.Errorf("503 reason %q does not name both members at their limit", r)
		}
	}
	st := w.status()
	s := statusService(st, "wlm")
	if s == nil || s.Refused != uint64(res.Refused503) {
		t.Errorf("/status refused_no_target %+v, want %d", s, res.Refused503)
	} else {
		for _, tg := range s.Targets {
			if tg.SkippedAtLimit == 0 {
				t.Errorf("/status: target %s never skipped at its limit: %+v", tg.Name, tg)
			}
		}
	}
	// The log: ERROR when no target could serve, and per sampling
	// interval the plug-in's WARNING for each member skipped at its limit.
	if l, ok := w.waitLog(time.Second, "no target can serve", "t1 (at limit 3/3)", "t2 (at limit 4/4)"); !ok || l.m["level"] != "error" {
		t.Errorf("no ERROR line for the service with every member full: %s", l.raw)
	}
	for _, name := range []string{"t1", "t2"} {
		if l, ok := w.waitLog(2*time.Second, "target "+name+" has reached maximum connections and is not selected"); !ok || l.m["level"] != "warn" {
			t.Errorf("no WARNING line for %s skipped at its limit: %s", name, l.raw)
		}
	}
	// The backlog drained: both members serve again.
	res = w.load("198.18.0.20:80", 2, 4)
	if res.OK != 4 || res.PerTarget["t1"] == 0 || res.PerTarget["t2"] == 0 {
		t.Errorf("after the backlog: %+v, want 4 OK from both members", res)
	}

	// tcp: the one slot taken, the next SYN is answered with RST.
	c1, err := w.echoOnce("198.18.0.21:23")
	if err != nil {
		t.Fatalf("first tcp connection: %v", err)
	}
	if c2, err := w.echoOnce("198.18.0.21:23"); err == nil {
		c2.Close()
		t.Fatal("second tcp connection was served past maxConnections 1")
	} else if !strings.Contains(err.Error(), "connection refused") && !strings.Contains(err.Error(), "connection reset") {
		t.Errorf("second tcp connection: %v, want refused or reset", err)
	}
	c1.Close()
	if !testutil.WithinEvery(5*time.Second, 50*time.Millisecond, func() bool {
		c3, err2 := w.echoOnce("198.18.0.21:23")
		if err2 == nil {
			c3.Close()
		}
		err = err2
		return err2 == nil
	}) {
		t.Fatalf("tcp slot not free 5s after the first connection closed: %v", err)
	}
}

// TestE2ELimits: an enforced connection limit and an enforced bandwidth
// limit refuse with a 503 naming the limit; a log-only connection limit
// lets every connection through and writes the Sun-style error-log line.
func TestE2ELimits(t *testing.T) {
	w := startWeir(t, "limits.yaml")
	hold := make(chan struct{})
	w.heldBackend("t1", "198.18.1.1:8081", 0, hold)
	w.backend("t2", "198.18.1.2:8082", 800*time.Millisecond)
	big := &bench.Backend{Name: "t3", Body: 200_000}
	ln := w.listen("198.18.1.3:8083")
	go big.Serve(ln)
	t.Cleanup(func() { big.Close() })

	// Enforced maxConnections 2: of 6 concurrent slow clients 2 are served.
	res := w.heldLoad(hold, "198.18.0.10:80", 6, 6, func() bool {
		return refusalCount(w.status(), "virtual server", "maxConnections") >= 4
	})
	if res.OK != 2 || res.Refused503 != 4 {
		t.Fatalf("capped: ok=%d 503=%d, want 2 and 4: %+v", res.OK, res.Refused503, res)
	}
	for r := range res.Reasons {
		if !strings.Contains(r, "maxConnections 2") {
			t.Errorf("capped: 503 reason %q does not name the limit", r)
		}
	}

	// Log-only maxConnections 1: all 3 served, and the error log says so.
	res = w.load("198.18.0.11:80", 3, 3)
	if res.OK != 3 {
		t.Fatalf("logged: ok=%d of 3: %+v", res.OK, res)
	}
	// The Sun-style error-log line, at warning severity.
	if l, ok := w.waitLog(3*time.Second, `"logged"`, "maxConnections 1 reached", "not enforced"); !ok {
		t.Errorf("no log line for the log-only limit of \"logged\"")
	} else if l.m["level"] != "warn" || l.m["qos_level"] != "virtual server" || l.m["limit"] != "maxConnections" || l.m["enforced"] != false {
		t.Errorf("log-only limit's line: %s", l.raw)
	}
	if n := refusalCount(w.status(), "virtual server", "maxConnections"); n != 4 {
		t.Errorf("/status refusals by maxConnections: %d, want 4", n)
	}

	// Enforced maxBandwidth 20 kB/s over 2 s: one 200 kB answer puts the
	// service over (bytes are credited at the next 100 ms recompute; the
	// loads above took long enough that the windows have started); the
	// next connection gets a 503 naming the limit, until the window
	// forgets the burst.
	res = w.load("198.18.0.12:80", 1, 1)
	if res.OK != 1 || res.Bytes < 200_000 {
		t.Fatalf("metered: first request %+v", res)
	}
	w.waitStatus(2*time.Second, "metered over its bandwidth", func(st api.Status) bool {
		l := statusLevel(st, "virtual server", "metered")
		return l != nil && l.Bandwidth > 20_000 && l.Over
	})
	res = w.load("198.18.0.12:80", 1, 1)
	if res.Refused503 != 1 {
		t.Fatalf("metered: over its bandwidth and not refused: %+v", res)
	}
	for r := range res.Reasons {
		if !strings.Contains(r, "maxBandwidth 20000 B/s exceeded") {
			t.Errorf("metered: 503 reason %q, want the maxBandwidth limit named", r)
		}
	}
	if l, ok := w.waitLog(time.Second, `"metered"`, "maxBandwidth 20000 B/s exceeded", "enforced"); !ok {
		t.Errorf("no log line for the bandwidth limit of \"metered\"")
	} else if l.m["level"] != "warn" || l.m["limit"] != "maxBandwidth" || l.m["enforced"] != true {
		t.Errorf("bandwidth limit's line: %s", l.raw)
	}
	if n := refusalCount(w.status(), "virtual server", "maxBandwidth"); n != 1 {
		t.Errorf("/status refusals by maxBandwidth: %d, want 1", n)
	}
	if !testutil.WithinEvery(5*time.Second, 100*time.Millisecond, func() bool {
		res = w.load("198.18.0.12:80", 1, 1)
		return res.OK == 1
	}) {
		t.Fatalf("metered: still refused 5s after the burst (window 2s): %+v", res)
	}
}

// TestE2EFailover: a primary whose connects are refused is marked down and
// the connection goes on to the next target, unseen by the client; with the
// live primary at its maxConnections the backup serves, and once the
// primary has room again it serves alone.
func TestE2EFailover(t *testing.T) {
	w := startWeir(t, "failover.yaml")
	hold := make(chan struct{}) // until all three are in progress
	b2 := w.heldBackend("t2", "198.18.1.2:8082", 0, hold)
	b3 := w.heldBackend("t3", "198.18.1.3:8083", 0, hold)

	res := w.heldLoad(hold, "198.18.0.10:80", 3, 3, func() bool { return b2.Active()+b3.Active() == 3 })
	t.Logf("3 clients: %v", res.PerTarget)
	if res.OK != 3 {
		t.Fatalf("failover: %d of 3 OK: %+v", res.OK, res)
	}
	if res.PerTarget["t2"] != 1 || res.PerTarget["t3"] != 2 || b2.MaxActive() != 1 {
		t.Errorf("served %v (t2 at most %d at once), want t2 1 (its maxConnections) and the backup t3 2", res.PerTarget, b2.MaxActive())
	}
	st := w.status()
	s := statusService(st, "web")
	if s == nil || len(s.Targets) != 3 {
		t.Fatalf("/status: %+v", s)
	}
	if t1 := s.Targets[0]; !t1.Down || t1.Failed == 0 {
		t.Errorf("t1 (nothing listening): %+v, want down with failed connects", t1)
	}
	if st.DialFailures == 0 {
		t.Errorf("/status dial_failures 0")
	}
	if l, ok := w.waitLog(time.Second, "target connect failed"); !ok || l.m["target"] != "t1" || l.m["level"] != "warn" {
		t.Errorf("no WARNING for t1's failed connect: %s", l.raw)
	}
	// The primary has room again: it serves, the backup does not. (A
	// slot frees when weir sees the connection close, a moment after the
	// client has its answer: wait for that before each request.)
	served3 := b3.Served()
	for i := 0; i < 2; i++ {
		w.waitStatus(3*time.Second, "every connection closed", func(st api.Status) bool { return st.Open == 0 })
		res = w.load("198.18.0.10:80", 1, 1)
		if res.OK != 1 || res.PerTarget["t2"] != 1 || b3.Served() != served3 {
			t.Errorf("with t2 free: %+v, want an answer from t2", res)
		}
	}
}

// TestE2EMultiqueue: with --queues 2 the TUN has two queues, each with its
// own datapath worker and NIC; the kernel spreads flows over them and every
// connection is served, in the configured proportions.
func TestE2EMultiqueue(t *testing.T) {
	w := startWeir(t, "weights.yaml", "--queues", "2")
	w.backend("t1", "198.18.1.1:8081", 0)
	w.backend("t2", "198.18.1.2:8082", 0)
	w.backend("t3", "198.18.1.3:8083", 0)
	res := w.load("198.18.0.10:80", 4, 120)
	if res.OK != 120 {
		t.Fatalf("%d of 120 OK over two queues: %+v", res.OK, res)
	}
	if res.PerTarget["t1"] != 60 || res.PerTarget["t2"] != 40 || res.PerTarget["t3"] != 20 {
		t.Errorf("per target %v, want t1 60, t2 40, t3 20", res.PerTarget)
	}
	if !strings.Contains(w.Log(), `"queues":2`) {
		t.Errorf("weir did not report two queues:\n%s", w.Log())
	}
}
