package admit_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"weir/bench"
	"weir/cmd/weir/internal/appliance"
	"weir/cmd/weir/internal/lab"
	"weir/policy"
)

// manualNow is a clock the test steps.
type manualNow struct {
	mu sync.Mutex
	t  time.Time
}

func (m *manualNow) now() time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.t
}

func (m *manualNow) add(d time.Duration) {
	m.mu.Lock()
	m.t = m.t.Add(d)
	m.mu.Unlock()
}

// TestClientBandwidthLab: an http service's per-client maxBandwidth with
// Sun's window (metricInterval 3 s): a client that downloaded 300 kB is
// over 50 kB/s and its next request gets the 503 page naming it, until
// the bytes are older than the window.
func TestClientBandwidthLab(t *testing.T) {
	cfg := lab.WebConfig([]int{1}, nil)
	cfg.Instance.MetricInterval = 3 * time.Second
	cfg.Services[0].ClientLimits = policy.ClientLimits{Limits: policy.Limits{MaxBandwidth: 50_000, EnforceBandwidth: true}}
	clk := &manualNow{t: time.Unix(1_700_000_000, 0)}
	l := lab.Must(t, cfg, lab.Options{
		Backend:   func(_ policy.TargetKey, b *bench.Backend) { b.Body = 300_000 },
		Appliance: appliance.Options{Now: clk.now},
	})
	get := func() bench.Result {
		return bench.Load{Dial: l.Dial, Addr: "198.19.0.80:80", Clients: 1, Requests: 1, Duration: 10 * time.Second}.Run(context.Background())
	}
	l.App.RecomputeNow()
	if r := get(); r.OK != 1 {
		t.Fatalf("first download: %+v", r)
	}
	clk.add(100 * time.Millisecond)
	l.App.RecomputeNow()
	r := get()
	if r.Refused503 != 1 {
		t.Fatalf("after 300 kB in a 3 s window (100 kB/s > 50 kB/s): %+v, want refused", r)
	}
	for reason := range r.Reasons {
		if !strings.Contains(reason, "client 198.18.0.2: maxBandwidth 50000 B/s exceeded") {
			t.Errorf("503 reason %q does not name the client's bandwidth", reason)
		}
	}
	for i := 0; i < 28; i++ {
		clk.add(100 * time.Millisecond)
		l.App.RecomputeNow()
	}
	if r := get(); r.Refused503 != 1 {
		t.Fatalf("at 2.9 s, the download still in the window: %+v, want refused", r)
	}
	clk.add(200 * time.Millisecond)
	l.App.RecomputeNow()
	if r := get(); r.OK != 1 {
		t.Fatalf("at 3.1 s, the download out of the window: %+v, want served", r)
	}
}

// TestQueueTCPLab: a tcp service at maxConnections 1 with a queue of 4:
// four clients at once are all served, one at a time at the backend, the
// three that waited counted in the level's queue.
func TestQueueTCPLab(t *testing.T) {
	cfg := lab.WebConfig([]int{1}, nil)
	cfg.Services[0].Proto = policy.ProtoTCP
	cfg.Services[0].Limits = policy.Limits{MaxConnections: 1, EnforceConnections: true, Queue: 4, QueueTimeout: 10 * time.Second}
	l := lab.Must(t, cfg, lab.Options{Backend: func(_ policy.TargetKey, b *bench.Backend) { b.Delay = 50 * time.Millisecond }})
	res := bench.Load{Dial: l.Dial, Addr: "198.19.0.80:80", Clients: 4, Requests: 4, Duration: 30 * time.Second}.Run(context.Background())
	b := l.Backends[policy.TargetKey{Service: "web", Target: "t1"}]
	if res.OK != 4 || b.MaxActive() != 1 {
		t.Fatalf("%+v, backend peak %d: want 4 served one at a time", res, b.MaxActive())
	}
	var q policy.QueueStat
	for _, lv := range l.App.Status().Levels {
		if lv.Name == "web" && lv.Queue != nil {
			q = policy.QueueStat{Waits: lv.Queue.Waits, Served: lv.Queue.Served, TimedOut: lv.Queue.TimedOut}
		}
	}
	if q.Waits == 0 || q.Served != q.Waits || q.TimedOut != 0 {
		t.Fatalf("queue %+v, want waits, all served", q)
	}
}
