// Admission's scenario tests run the whole appliance in a lab: the lab
// imports the appliance, which imports admit, so they live in an external
// test package.
package admit_test

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"weir/bench"
	"weir/cmd/weir/internal/appliance"
	"weir/cmd/weir/internal/lab"
	"weir/cmd/weir/internal/obs"
	"weir/internal/testutil"
	"weir/netstack/proxy"
	"weir/policy"
)

// TestMain fails the package if any test leaves a goroutine running.
func TestMain(m *testing.M) { testutil.VerifyNoLeaks(m) }

// refusals is the number of connections refused by the given level's limit.
func refusals(a *appliance.Appliance, level, limit string) uint64 {
	for _, r := range a.Status().Refusals {
		if r.Level == level && r.Limit == limit {
			return r.Count
		}
	}
	return 0
}

// waitClosed waits until every admitted connection has been reported closed:
// a client has its answer a moment before weir sees both legs end.
func waitClosed(t *testing.T, a *appliance.Appliance) {
	t.Helper()
	testutil.Eventually(t, 5*time.Second, func() bool { return a.OpenConnections() == 0 }, "every connection reported closed")
}

func TestWebSphereMaxConnections(t *testing.T) {
	cfg := lab.WebConfig([]int{1, 1}, []int64{3, 4})
	var accessBuf testutil.SyncBuffer
	access := obs.NewAccessLog(&accessBuf, true)
	// The members hold every request until the 23 refusals are counted:
	// the 7 served stay open however slowly a loaded machine brings the
	// 30 clients in.
	hold := make(chan struct{})
	l := lab.Must(t, cfg, lab.Options{
		Backend:   func(_ policy.TargetKey, b *bench.Backend) { b.Hold = hold },
		Appliance: appliance.Options{Access: access},
	})
	done := make(chan bench.Result, 1)
	go func() {
		done <- bench.Load{Dial: l.Dial, Addr: "198.19.0.80:80", Clients: 30, Requests: 30, Duration: 30 * time.Second}.Run(context.Background())
	}()
	held := testutil.Within(20*time.Second, func() bool { return l.App.Status().Services[0].Refused >= 23 })
	close(hold)
	res := <-done
	if !held {
		t.Fatalf("23 refusals not counted while 7 requests were held: %+v", res)
	}
	b1, b2 := l.Backends[policy.TargetKey{Service: "web", Target: "t1"}], l.Backends[policy.TargetKey{Service: "web", Target: "t2"}]
	if b1.MaxActive() > 3 || b2.MaxActive() > 4 {
		t.Errorf("max active t1=%d (limit 3) t2=%d (limit 4)", b1.MaxActive(), b2.MaxActive())
	}
	if res.OK != 7 || res.OK+res.Refused503 != 30 {
		t.Fatalf("ok=%d 503=%d of 30, want 7 (3+4) and 23: %+v", res.OK, res.Refused503, res)
	}
	var reason string
	for r := range res.Reasons {
		reason = r
	}
	if !strings.Contains(reason, "t1 (at limit 3/3)") || !strings.Contains(reason, "t2 (at limit 4/4)") {
		t.Errorf("503 reason %q does not name both members at their limit", reason)
	}
	// The access log has the request line and 503 for each refusal, as the
	// plug-in's web server logs it. A refused client has its page a
	// moment before weir writes the line, as a served one has its answer
	// before weir sees both legs end: wait for both.
	waitClosed(t, l.App)
	testutil.Within(5*time.Second, func() bool {
		access.Flush()
		return strings.Count(accessBuf.String(), `"GET / HTTP/1.1" 503 `) >= res.Refused503
	})
	if n := strings.Count(accessBuf.String(), `"GET / HTTP/1.1" 503 `); n != res.Refused503 {
		t.Errorf("access log has %d 503 lines, want %d:\n%s", n, res.Refused503, accessBuf.String())
	}
	// One line per request (an http service is proxied request by
	// request), as the plug-in's web server logs them.
	if n := strings.Count(accessBuf.String(), `"GET / HTTP/1.1" 200 `); n != res.OK {
		t.Errorf("access log has %d served lines, want %d:\n%s", n, res.OK, accessBuf.String())
	}
	// Backlog drained: both serve again.
	res = bench.Load{Dial: l.Dial, Addr: "198.19.0.80:80", Clients: 2, Requests: 4, Duration: 30 * time.Second}.Run(context.Background())
	if res.PerTarget["t1"] == 0 || res.PerTarget["t2"] == 0 {
		t.Errorf("after the backlog: %v, want both serving", res.PerTarget)
	}
}

func TestEnforcedLimitRefusesWithPage(t *testing.T) {
	cfg := lab.WebConfig([]int{1}, nil)
	cfg.Services[0].Limits = policy.Limits{MaxConnections: 2, EnforceConnections: true}
	hold := make(chan struct{}) // the 2 served wait until the 4 refusals are counted
	l := lab.Must(t, cfg, lab.Options{Backend: func(_ policy.TargetKey, b *bench.Backend) { b.Hold = hold }})
	done := make(chan bench.Result, 1)
	go func() {
		done <- bench.Load{Dial: l.Dial, Addr: "198.19.0.80:80", Clients: 6, Requests: 6, Duration: 30 * time.Second}.Run(context.Background())
	}()
	testutil.Within(20*time.Second, func() bool { return refusals(l.App, "virtual server", "maxConnections") >= 4 })
	close(hold)
	res := <-done
	if res.OK != 2 || res.Refused503 != 4 {
		t.Fatalf("ok=%d 503=%d, want 2 and 4: %+v", res.OK, res.Refused503, res)
	}
	for r := range res.Reasons {
		if !strings.Contains(r, "maxConnections 2") {
			t.Errorf("503 reason %q does not name the limit", r)
		}
	}
}

// TestMaxAttemptsOneOwner: with maxAttempts 5 and three refusing targets
// ahead of a healthy one, the balancer's tried-set alone bounds the dials.
// The client is served by the fourth pick, each refusing target is marked
// down for having failed, and the healthy target is never marked down (the
// forwarder used to stop after 3 dials of its own and report the fourth,
// never-dialed pick as failed: a 503, and a healthy target down for the
// retry interval).
func TestMaxAttemptsOneOwner(t *testing.T) {
	cfg := lab.WebConfig([]int{1, 1, 1, 1}, nil)
	cfg.Balancer.MaxAttempts = 5
	var accessBuf testutil.SyncBuffer
	access := obs.NewAccessLog(&accessBuf, false)
	l := lab.Must(t, cfg, lab.Options{Appliance: appliance.Options{Access: access}})
	for _, name := range []string{"t1", "t2", "t3"} {
		l.Backends[policy.TargetKey{Service: "web", Target: name}].Close() // its stack answers SYNs with RST
	}
	res := bench.Load{Dial: l.Dial, Addr: "198.19.0.80:80", Clients: 1, Requests: 1, Duration: 30 * time.Second}.Run(context.Background())
	if res.OK != 1 || res.PerTarget["t4"] != 1 {
		t.Fatalf("client not served by t4: %+v", res)
	}
	waitClosed(t, l.App)
	for _, tg := range l.App.Status().Services[0].Targets {
		switch tg.Name {
		case "t4":
			if tg.Down || tg.Failed != 0 || tg.Picked != 1 {
				t.Errorf("healthy t4: down %v, failed %d, picked %d; want up, 0 failed, 1 picked", tg.Down, tg.Failed, tg.Picked)
			}
		default:
			if !tg.Down || tg.Failed != 1 {
				t.Errorf("refusing %s: down %v, failed %d; want down after 1 failed dial", tg.Name, tg.Down, tg.Failed)
			}
		}
	}
	// The access line says what happened: served, by t4.
	access.Flush()
	if line := accessBuf.String(); !strings.Contains(line, `"target":"t4"`) || !strings.Contains(line, `"outcome":"ok"`) {
		t.Errorf("access log %q, want t4 and outcome ok", line)
	}
}

// TestAccessOutcomes: the access log's outcomes are the forwarder's, each
// with its Common Log Format status.
func TestAccessOutcomes(t *testing.T) {
	for o, code := range map[proxy.Outcome]string{
		proxy.Served: "200", proxy.IdleClosed: "200", proxy.RefusedReset: "503", proxy.RefusedPage: "503",
		proxy.Aborted: "500", proxy.TargetTimedOut: "504", proxy.Panicked: "500", proxy.BadGateway: "502",
		proxy.ClientFailed: "400",
	} {
		line := obs.CLF(obs.AccessRecord{Client: "198.18.0.2:4000", VIP: "198.19.0.80:80", Target: "t1", Outcome: o.String()})
		if !strings.Contains(line, `"TCP 198.19.0.80:80 t1" `+code+" ") {
			t.Errorf("outcome %s: %s, want status %s", o, line, code)
		}
	}
}

// TestRefusalPageNamesEveryLimit is Sun's "an error page stating which
// limits caused the 503 error and the value of the statistic that
// triggered the limit": with the class and the instance both full, the
// page, its X-Weir-Limit header and its reason name both, with the
// statistic.
func TestRefusalPageNamesEveryLimit(t *testing.T) {
	cfg := lab.WebConfig([]int{1}, nil)
	cl := &policy.Class{Name: "basic", Limits: policy.Limits{MaxConnections: 1, EnforceConnections: true}}
	cfg.Classes = []*policy.Class{cl}
	cfg.Services[0].Class = cl
	cfg.Instance.Limits = policy.Limits{MaxConnections: 1, EnforceConnections: true}
	hold := make(chan struct{})
	l := lab.Must(t, cfg, lab.Options{Backend: func(_ policy.TargetKey, b *bench.Backend) { b.Hold = hold }})
	done := make(chan bench.Result, 1)
	go func() {
		done <- bench.Load{Dial: l.Dial, Addr: "198.19.0.80:80", Clients: 1, Requests: 1, Duration: 30 * time.Second}.Run(context.Background())
	}()
	testutil.Eventually(t, 20*time.Second, func() bool { return l.App.OpenConnections() == 1 }, "the first request admitted")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := l.Dial(ctx, "tcp", "198.19.0.80:80")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := c.Write([]byte("GET / HTTP/1.1\r\nHost: web\r\nConnection: close\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(c)
	close(hold)
	if res := <-done; res.OK != 1 {
		t.Errorf("the held request: %+v", res)
	}
	for _, want := range []string{
		"HTTP/1.1 503 ",
		"X-Weir-Limit: maxConnections=1, maxConnections=1\r\n",
		`class &#34;basic&#34;: maxConnections 1 reached (1 open); instance &#34;weir&#34;: maxConnections 1 reached (1 open)`,
		"<li>class &#34;basic&#34;: <b>maxConnections</b> = 1, measured 1</li>",
		"<li>instance &#34;weir&#34;: <b>maxConnections</b> = 1, measured 1</li>",
	} {
		if !strings.Contains(string(page), want) {
			t.Errorf("page lacks %q:\n%s", want, page)
		}
	}
	waitClosed(t, l.App)
}

// TestTCPRefusalLogNamesEveryLimit: a tcp service's refusal is a RST, and
// its log line names every limit over, as the 503 page does.
func TestTCPRefusalLogNamesEveryLimit(t *testing.T) {
	cfg := lab.WebConfig([]int{1}, nil)
	cfg.Services[0].Proto = policy.ProtoTCP
	cl := &policy.Class{Name: "basic", Limits: policy.Limits{MaxConnections: 1, EnforceConnections: true}}
	cfg.Classes = []*policy.Class{cl}
	cfg.Services[0].Class = cl
	cfg.Instance.Limits = policy.Limits{MaxConnections: 1, EnforceConnections: true}
	var logBuf testutil.SyncBuffer
	log := zerolog.New(&logBuf)
	l := lab.Must(t, cfg, lab.Options{Appliance: appliance.Options{Log: &log}})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c1, err := l.Dial(ctx, "tcp", "198.19.0.80:80")
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 20*time.Second, func() bool { return l.App.OpenConnections() == 1 }, "the first connection admitted")
	c2, err := l.Dial(ctx, "tcp", "198.19.0.80:80")
	if err == nil {
		_ = c2.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, err = c2.Read(make([]byte, 1))
		c2.Close()
	}
	if err == nil {
		t.Fatal("the second connection was not refused")
	}
	const want = `refused: class \"basic\": maxConnections 1 reached (1 open); instance \"weir\": maxConnections 1 reached (1 open)`
	testutil.Eventually(t, 10*time.Second, func() bool { return strings.Contains(logBuf.String(), want) }, "the log line %s in:\n%s", want, &logBuf)
	c1.Close()
	waitClosed(t, l.App)
}
