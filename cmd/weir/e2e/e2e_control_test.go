//go:build linux

package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"weir/bench"
	"weir/cmd/weir/api"
)

// TestE2EReloadUnderLoad: SIGHUP swaps in new weights and a limit while 4
// clients run 40 slow requests: every request is answered, the generation
// goes to 2, no counter goes back and none is lost, and the new weights
// rule the traffic after. A broken config sent the same way is rejected,
// shown in /status, and the running one keeps serving.
func TestE2EReloadUnderLoad(t *testing.T) {
	w := startWeir(t, "reload-before.yaml")
	w.backend("t1", "198.18.1.1:8081", 150*time.Millisecond)
	w.backend("t2", "198.18.1.2:8082", 150*time.Millisecond)

	done := make(chan bench.Result, 1)
	go func() { done <- w.load("198.18.0.10:80", 4, 40) }()
	before := w.waitStatus(3*time.Second, "under load", func(st api.Status) bool {
		n, _ := pickedSum(st, "web")
		return n >= 8 && st.Open > 0
	})
	w.writeConfig("reload-after.yaml")
	w.signal(syscall.SIGHUP)
	after := w.waitStatus(3*time.Second, "reloaded", func(st api.Status) bool { return st.Generation == 2 })
	res := <-done
	if res.OK != 40 {
		t.Fatalf("reload under load: %d of 40 OK: %+v", res.OK, res)
	}
	if after.ReloadError != nil {
		t.Errorf("reload error after a good config: %+v", after.ReloadError)
	}
	if s := statusService(after, "web"); s == nil || len(s.Targets) != 2 || s.Targets[1].Weight != 5 {
		t.Errorf("after the reload: %+v, want t2 at weight 5", s)
	}
	if l := statusLevel(after, "virtual server", "web"); l == nil || l.MaxConnections != 100 {
		t.Errorf("after the reload: level %+v, want maxConnections 100", l)
	}
	// Counters carried over: the picks and closes of the whole load, seen
	// across the reload, never going back.
	final := w.waitStatus(3*time.Second, "every connection closed", func(st api.Status) bool { return st.Open == 0 })
	nBefore, byBefore := pickedSum(before, "web")
	nAfter, byAfter := pickedSum(final, "web")
	if nAfter != 40 {
		t.Errorf("picked after the reload sums to %d (%v), want 40", nAfter, byAfter)
	}
	for name, n := range byBefore {
		if byAfter[name] < n {
			t.Errorf("target %s picked %d before the reload, %d after", name, n, byAfter[name])
		}
	}
	t.Logf("picked before the reload %d %v, after %d %v", nBefore, byBefore, nAfter, byAfter)
	fams := w.metrics()
	if v := metricSum(fams, "weir_connections_closed_total", nil); v != 40 {
		t.Errorf("weir_connections_closed_total %v, want 40", v)
	}
	if v := metricSum(fams, "weir_reloads_total", nil); v != 1 {
		t.Errorf("weir_reloads_total %v, want 1", v)
	}

	// The new weights rule: 1:5 over 2 whole rounds.
	res = w.load("198.18.0.10:80", 1, 12)
	if res.OK != 12 || res.PerTarget["t2"] < 8 {
		t.Errorf("after the reload: %+v, want 12 OK, about 10 from t2", res)
	}
	t.Logf("after the reload, one client: %v", res.PerTarget)

	// A config that does not validate: rejected, shown, the old one runs.
	w.writeConfig("reload-bad.yaml")
	w.signal(syscall.SIGHUP)
	st := w.waitStatus(3*time.Second, "showing the reload error", func(st api.Status) bool { return st.ReloadError != nil })
	if st.Generation != 2 {
		t.Errorf("generation %d after a rejected config, want 2", st.Generation)
	}
	if _, ok := w.waitLog(time.Second, "configuration rejected"); !ok {
		t.Errorf("no log line for the rejected config")
	}
	if res := w.load("198.18.0.10:80", 1, 6); res.OK != 6 {
		t.Errorf("after a rejected config: %+v", res)
	}
	if v := metricSum(w.metrics(), "weir_reload_failures_total", nil); v != 1 {
		t.Errorf("weir_reload_failures_total %v, want 1", v)
	}
}

// metrics scrapes and parses /metrics.
func (w *weirProc) metrics() map[string]*metricFamily {
	w.t.Helper()
	resp, err := w.HTTP.Get("http://" + w.Admin + "/metrics")
	if err != nil {
		w.t.Fatalf("/metrics: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		w.t.Fatalf("/metrics: %s", resp.Status)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		w.t.Errorf("/metrics content type %q", ct)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		w.t.Fatalf("/metrics does not parse: %v", err)
	}
	return fams
}

// metricSum adds up a family's counter or gauge values over the series
// whose labels include all of labels.
func metricSum(fams map[string]*metricFamily, name string, labels map[string]string) float64 {
	f := fams[name]
	if f == nil {
		return -1
	}
	var sum float64
series:
	for _, m := range f.Metric {
		for k, v := range labels {
			found := false
			for _, lp := range m.Label {
				if lp.GetName() == k && lp.GetValue() == v {
					found = true
				}
			}
			if !found {
				continue series
			}
		}
		switch {
		case m.Counter != nil:
			sum += m.Counter.GetValue()
		case m.Gauge != nil:
			sum += m.Gauge.GetValue()
		case m.Untyped != nil:
			sum += m.Untyped.GetValue()
		}
	}
	return sum
}

// TestE2EMetrics: /metrics of the running binary scrapes and parses, with
// weir's own families, the Go and process collectors, and values that match
// the traffic; /healthz answers 200.
func TestE2EMetrics(t *testing.T) {
	w := startWeir(t, "metrics.yaml")
	w.backend("t1", "198.18.1.1:8081", 0)
	if res := w.load("198.18.0.10:80", 2, 10); res.OK != 10 {
		t.Fatalf("load: %+v", res)
	}
	w.waitStatus(3*time.Second, "every connection closed", func(st api.Status) bool { return st.Open == 0 })
	// One STATS line per target and sampling interval (300 ms here).
	if l, ok := w.waitLog(2*time.Second, "STATS"); !ok || l.m["service"] != "web" || l.m["target"] != "t1" || l.m["weight"] != 1.0 {
		t.Errorf("no STATS line for web/t1: %s", l.raw)
	}
	fams := w.metrics()
	for _, name := range []string{
		"weir_connections_open", "weir_connections_closed_total", "weir_reloads_total",
		"weir_target_picked_total", "weir_target_weight", "weir_target_up", "weir_target_connections_open",
		"weir_level_connections", "weir_level_bandwidth_bytes_per_second",
		"weir_datapath_dropped_total", "weir_datapath_marked_total", "weir_connections_accepted_total",
		"weir_target_fraction_percent",
		"go_goroutines", "process_cpu_seconds_total",
	} {
		if fams[name] == nil {
			t.Errorf("metric %s missing", name)
		}
	}
	var weirFams int
	for name := range fams {
		if strings.HasPrefix(name, "weir_") {
			weirFams++
		}
	}
	t.Logf("%d metric families, %d of them weir_", len(fams), weirFams)
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"weir_connections_closed_total", nil, 10},
		{"weir_connections_open", nil, 0},
		{"weir_target_picked_total", map[string]string{"service": "web", "target": "t1"}, 10},
		{"weir_target_up", map[string]string{"service": "web", "target": "t1"}, 1},
		{"weir_target_weight", map[string]string{"service": "web", "target": "t1", "kind": "base"}, 1},
		{"weir_connections_accepted_total", nil, 10},
	} {
		if got := metricSum(fams, c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	if v := metricSum(fams, "weir_datapath_marked_total", nil); v < 30 {
		t.Errorf("weir_datapath_marked_total %v, want ≥ 30 (a rule marks every packet of the 10 connections)", v)
	}
	if code, body, err := w.Get("/healthz"); err != nil || code != http.StatusOK {
		t.Errorf("/healthz: %d %v %s", code, err, body)
	}
}

// TestE2ESigtermDrains: with three slow requests in flight, SIGTERM makes
// weir refuse new connections (RST) and report draining, lets the three
// finish with 200, and exit 0 long before the grace period, its access log
// holding one line per served connection.
func TestE2ESigtermDrains(t *testing.T) {
	const grace = 10 * time.Second
	accessLog := filepath.Join(t.TempDir(), "access.log")
	w := startWeir(t, "drain.yaml", "--grace", grace.String(), "--access-log", accessLog)
	// The three requests are held until weir is seen draining and
	// refusing: they are in flight across SIGTERM however slow the host.
	hold := make(chan struct{})
	release := sync.OnceFunc(func() { close(hold) })
	defer release()
	w.heldBackend("t1", "198.18.1.1:8081", 0, hold)

	done := make(chan bench.Result, 1)
	go func() { done <- w.load("198.18.0.10:80", 3, 3) }()
	w.waitStatus(10*time.Second, "3 in flight", func(st api.Status) bool { return st.Open == 3 })
	sent := time.Now()
	w.signal(syscall.SIGTERM)
	w.waitStatus(time.Second, "draining", func(st api.Status) bool { return st.Draining })
	if code, _, err := w.Get("/healthz"); err != nil || code == http.StatusOK {
		t.Errorf("/healthz while draining: %d %v, want an error status", code, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	c, err := w.ns.Dial(ctx, "tcp", "198.18.0.10:80")
	cancel()
	if err == nil {
		c.Close()
		t.Error("a new connection was accepted while draining")
	} else if !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("new connection while draining: %v, want connection refused", err)
	}
	release()
	res := <-done
	if res.OK != 3 {
		t.Errorf("in-flight requests across SIGTERM: %+v, want 3 OK", res)
	}
	code, err := w.Wait(grace)
	took := time.Since(sent)
	if err != nil || code != 0 {
		t.Fatalf("weir after SIGTERM: exit %d, %v", code, err)
	}
	if took >= grace {
		t.Errorf("exit %v after SIGTERM, not within the grace %v", took, grace)
	}
	t.Logf("exit 0 %v after SIGTERM", took.Round(time.Millisecond))
	if _, ok := w.waitLog(0, "draining"); !ok {
		t.Error("no draining log line")
	}
	if _, ok := w.waitLog(0, "weir stopped"); !ok {
		t.Error("no stop log line")
	}

	// The access log, flushed at exit: the three connections, served by t1.
	b, err := os.ReadFile(accessLog)
	if err != nil {
		t.Fatal(err)
	}
	var served int
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var r struct {
			Client, VIP, Service, Target, Outcome string
			BytesIn                               uint64 `json:"bytes_in"`
			BytesOut                              uint64 `json:"bytes_out"`
		}
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Errorf("access log line %q: %v", line, err)
			continue
		}
		if r.Outcome == "ok" {
			served++
			if r.Service != "web" || r.Target != "t1" || r.VIP != "198.18.0.10:80" ||
				!strings.HasPrefix(r.Client, "198.18.0.1:") || r.BytesIn == 0 || r.BytesOut == 0 {
				t.Errorf("access log line %s", line)
			}
		}
	}
	if served != 3 {
		t.Errorf("access log has %d served connections, want 3:\n%s", served, b)
	}
}

type metricFamily = dto.MetricFamily
