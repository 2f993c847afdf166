package cluster

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"weir/policy"
)

// simNode is one of many in-process instances: its own Admission and
// Cluster against the shared Redis, and a demand: the connections it
// tries to keep open (its driver admits up to want, releases above it).
type simNode struct {
	adm  *policy.Admission
	cfg  *policy.Config
	c    *Cluster
	want atomic.Int64
	open atomic.Int64
	held []policy.Ticket
	// all counts the connections held over every node: incremented after
	// an admission, decremented before a release, so that it never counts
	// more than are open; allPeak is its largest value.
	all, allPeak *atomic.Int64
}

func (n *simNode) admitted() {
	o := n.all.Add(1)
	for p := n.allPeak.Load(); o > p && !n.allPeak.CompareAndSwap(p, o); p = n.allPeak.Load() {
	}
}

// drive runs in its own goroutine until stop: every 5 ms it tries to
// admit a connection for each it lacks below want (clients that retry
// every 5 ms) and releases what is above it.
func (n *simNode) drive(stop <-chan struct{}, wg *sync.WaitGroup) {
	defer wg.Done()
	vs := n.cfg.ServiceByName("web")
	tk := time.NewTicker(5 * time.Millisecond)
	defer tk.Stop()
	for {
		select {
		case <-stop:
			for i := range n.held {
				n.all.Add(-1)
				n.held[i].Release()
			}
			n.open.Store(0)
			return
		case <-tk.C:
		}
		w := n.want.Load()
		for int64(len(n.held)) > w {
			n.all.Add(-1)
			n.held[len(n.held)-1].Release()
			n.held = n.held[:len(n.held)-1]
		}
		// Every client not served tries again (a refusal each, the demand
		// the share did not meet).
		for missing := w - int64(len(n.held)); missing > 0; missing-- {
			n.held = append(n.held, policy.Ticket{})
			if _, ok := n.adm.Admit(vs, &n.held[len(n.held)-1]); !ok {
				n.held = n.held[:len(n.held)-1]
			} else {
				n.admitted()
			}
		}
		n.open.Store(int64(len(n.held)))
	}
}

// TestSimulate100Instances runs the lease protocol at 100 instances (real
// Cluster and Admission each, one real Redis, lease interval 500 ms) and
// reports its convergence and slack: the time until the open connections
// reach 95 % of the limit under a demand above it, the slots left unused
// meanwhile (limit − open) once converged, and the same after the demand
// moves to 10 of the instances. The limit must hold throughout. Skipped
// with -short.
func TestSimulate100Instances(t *testing.T) {
	if testing.Short() {
		t.Skip("skipping the 100-instance simulation in -short mode")
	}
	r := startRedis(t)
	// The 100 instances would run on 100 hosts and Redis on its own; here
	// they share two cores with whatever else runs. Redis is given a
	// higher priority (as root), so that the renewals measure the
	// protocol's load on Redis rather than the host's on Redis: without
	// it, at a host load of 15-30, a script call took 1-5 ms of Redis's
	// wall time (200-800 µs when sequential) and renewals timed out
	// before and after any change.
	if err := syscall.Setpriority(syscall.PRIO_PROCESS, r.Pid(), -10); err != nil {
		t.Logf("redis-server keeps its priority (%v): renewals may time out on a loaded host", err)
	}
	const (
		members = 100
		limit   = 1000
		lease   = 500 * time.Millisecond
	)
	nodes := make([]*simNode, members)
	var logMu sync.Mutex
	var downLogs []string
	// The outages by the part of the run they came in.
	stage := "start"
	downBy := map[string]int{}
	var all, allPeak atomic.Int64
	for i := range nodes {
		cfg, err := policy.Compile(&policy.Config{
			Services: []*policy.VirtualServer{{
				Name: "web", VIPs: []netip.Addr{netip.MustParseAddr("198.18.0.1")}, Ports: policy.PortRange{Lo: 80, Hi: 80},
				Limits:  policy.Limits{MaxConnections: limit, EnforceConnections: true},
				Targets: []*policy.Target{{Addr: netip.MustParseAddrPort("198.18.1.1:80"), Weight: 1}},
			}},
			Cluster: &policy.Cluster{Redis: r.Addr(), Name: "sim", Instance: fmt.Sprintf("n%03d", i), LeaseInterval: lease},
		})
		if err != nil {
			t.Fatal(err)
		}
		n := &simNode{cfg: cfg, adm: policy.NewAdmission(cfg, 0), all: &all, allPeak: &allPeak}
		n.c, err = New(Options{Config: *cfg.Cluster, Admission: n.adm, Logf: func(f string, a ...any) {
			if strings.Contains(f, "unreachable") {
				logMu.Lock()
				downBy[stage]++
				if len(downLogs) < 3 {
					downLogs = append(downLogs, fmt.Sprintf(f, a...))
				}
				logMu.Unlock()
			}
		}})
		if err != nil {
			t.Fatal(err)
		}
		nodes[i] = n
	}
	ctx, cancel := context.WithCancel(context.Background())
	var loops sync.WaitGroup
	for _, n := range nodes {
		loops.Add(1)
		go func() { defer loops.Done(); n.c.Loop(ctx) }()
	}
	stop := make(chan struct{})
	var drivers sync.WaitGroup
	for _, n := range nodes {
		drivers.Add(1)
		go n.drive(stop, &drivers)
	}
	defer func() {
		close(stop)
		drivers.Wait()
		cancel()
		loops.Wait()
		for _, n := range nodes {
			n.c.Close()
		}
	}()
	if !eventuallyMembers(nodes, members, 20*time.Second) {
		t.Fatalf("the %d members never all saw each other", members)
	}

	rdb := redis.NewClient(&redis.Options{Addr: r.Addr()})
	defer rdb.Close()
	rdb.ConfigResetStat(context.Background())
	statsFrom := time.Now()
	var peak atomic.Int64
	sum := func(ns []*simNode) int64 {
		var s int64
		for _, n := range ns {
			s += n.open.Load()
		}
		return s
	}
	// burst starts from an idle cluster (every want 0, two lease
	// intervals to settle), and sends per clients at once to each of on,
	// clients that do not retry: each is admitted, or borrows (as
	// admit does: up to 8 times while the cluster grants) and is admitted,
	// or is refused. It reports the connections served at once, the
	// refusals while the cluster-wide open count was below the limit, the
	// time until every client had its answer and the p99 of the wait a
	// client spent borrowing.
	setStage := func(name string) {
		logMu.Lock()
		stage = name
		logMu.Unlock()
	}
	burst := func(name string, on []*simNode, per int) {
		t.Helper()
		setStage(name)
		for _, n := range nodes {
			n.want.Store(0)
		}
		time.Sleep(2 * lease)
		var open, served, refusedFree atomic.Int64
		var mu sync.Mutex
		var waits []time.Duration
		var wg sync.WaitGroup
		release := make(chan struct{})
		start := time.Now()
		for _, n := range on {
			vs := n.cfg.ServiceByName("web")
			for range per {
				wg.Add(1)
				go func() {
					defer wg.Done()
					var tk policy.Ticket
					t0 := time.Now()
					r, ok := n.adm.Admit(vs, &tk)
					for i := 0; !ok && r.Shared && i < 8; i++ {
						if !n.c.Borrow(context.Background(), policy.LevelVirtualServer, "web") {
							break
						}
						r, ok = n.adm.Admit(vs, &tk)
					}
					w := time.Since(t0)
					mu.Lock()
					waits = append(waits, w)
					mu.Unlock()
					if !ok {
						if open.Load() < limit {
							refusedFree.Add(1)
						}
						return
					}
					open.Add(1)
					n.admitted()
					served.Add(1)
					<-release
					n.all.Add(-1)
					open.Add(-1)
					tk.Release()
				}()
			}
		}
		answered := func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(waits) == len(on)*per
		}
		for !answered() {
			time.Sleep(time.Millisecond)
		}
		took := time.Since(start)
		close(release)
		wg.Wait()
		slices.Sort(waits)
		// A refusal while fewer than limit were open may still be right:
		// the slot free at that instant may be another client's, admitted
		// a moment later. The refusals that left a slot unused are those
		// beyond the slots the burst filled.
		unused := min(int64(len(on)*per)-served.Load(), limit-served.Load())
		t.Logf("%s, from idle: %d of %d slots served at once, %d refused while fewer than %d were open (%d refused with a slot left unused); every client answered after %v (%.2f lease intervals); borrow wait p50 %v, p99 %v, max %v",
			name, served.Load(), limit, refusedFree.Load(), limit, unused, took.Round(time.Millisecond), took.Seconds()/lease.Seconds(),
			waits[len(waits)/2].Round(10*time.Microsecond), waits[len(waits)*99/100].Round(10*time.Microsecond), waits[len(waits)-1].Round(10*time.Microsecond))
	}
	// phase sets the wants, waits for 95 % of the limit on the nodes that
	// want, then watches the slack for 10 lease intervals.
	phase := func(name string, wants func(i int) int64, on []*simNode) {
		t.Helper()
		setStage(name)
		for i, n := range nodes {
			n.want.Store(wants(i))
		}
		start := time.Now()
		var conv time.Duration = -1
		var slackSum, samples, slackMax int64
		deadline := start.Add(30 * time.Second)
		var steadyUntil time.Time
		for now := time.Now(); now.Before(deadline); now = time.Now() {
			all, here := sum(nodes), sum(on)
			peak.Store(max(peak.Load(), all))
			if conv < 0 && here >= limit*95/100 {
				conv = time.Since(start)
				steadyUntil = now.Add(10 * lease)
			}
			if conv >= 0 {
				slack := limit - here
				slackSum += slack
				slackMax = max(slackMax, slack)
				samples++
				if now.After(steadyUntil) {
					break
				}
			}
			time.Sleep(2 * time.Millisecond)
		}
		if conv < 0 {
			t.Errorf("%s: never reached 95 %% of %d in 30 s (at %d)", name, limit, sum(on))
			return
		}
		t.Logf("%s: 95 %% of the limit after %v (%.1f lease intervals); then slack mean %.1f, max %d slots of %d (over %d samples, 10 intervals)",
			name, conv.Round(time.Millisecond), conv.Seconds()/lease.Seconds(), float64(slackSum)/float64(samples), slackMax, limit, samples)
	}
	burst("a burst of 2000 (2× the limit) spread over the 100", nodes, 20)
	burst("a burst of 2000 at 10 of the 100", nodes[:10], 200)
	phase("100 instances wanting 15 each (1500 for 1000)", func(int) int64 { return 15 }, nodes)
	phase("demand moved: 10 instances wanting 200 each, 90 idle", func(i int) int64 {
		if i < 10 {
			return 200
		}
		return 0
	}, nodes[:10])
	var renewals, outages uint64
	var why [3]uint64
	for _, n := range nodes {
		for i := range why {
			why[i] += n.c.why[i].Load()
		}
		renewals += n.c.Status().Renewals
		outages += n.c.Status().Outages
	}
	t.Logf("renewals by cause: %d periodic, %d early (local demand), %d nudged", why[0], why[1], why[2])
	logMu.Lock()
	t.Logf("%d outages seen (renewals that failed twice in a row), by part of the run %v; the first: %q", outages, downBy, downLogs)
	logMu.Unlock()
	// The limit holds while every instance renews in time. An instance
	// whose renewals failed (a starved test machine) runs on its
	// localShare fallback, limit/members, which the others do not see:
	// the documented overshoot, at most that share per instance in an
	// outage.
	if p := allPeak.Load(); p > limit && outages == 0 {
		t.Errorf("%d open over the cluster, limit %d, no outage", p, limit)
	} else if p > limit {
		t.Logf("%d open over the cluster, limit %d, during %d outages (localShare: limit/members each)", p, limit, outages)
	}
	t.Logf("peak %d of %d (sampled sum of the nodes' counts %d); %d renewals in all", allPeak.Load(), limit, peak.Load(), renewals)
	calls, trips := redisCalls(t, rdb)
	for _, line := range strings.Split(rdb.Info(context.Background(), "commandstats").Val(), "\n") {
		if strings.HasPrefix(line, "cmdstat_evalsha:") || strings.HasPrefix(line, "cmdstat_publish:") {
			t.Logf("Redis %s", strings.TrimSpace(line))
		}
	}
	secs := time.Since(statsFrom).Seconds()
	t.Logf("Redis cost per instance over the run: %.1f round trips/s, %.1f commands/s (lease %v)", float64(trips)/secs/members, float64(calls)/secs/members, lease)
}

func eventuallyMembers(nodes []*simNode, n int, d time.Duration) bool {
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		ok := true
		for _, x := range nodes {
			if len(x.c.Status().Members) != n {
				ok = false
				break
			}
		}
		if ok {
			return true
		}
	}
	return false
}

// redisCalls reads INFO commandstats: every command Redis ran since the
// last CONFIG RESETSTAT (INFO and CONFIG left out), and the round trips
// among them (EVAL, EVALSHA: one per script call).
func redisCalls(t *testing.T, rdb *redis.Client) (calls, trips int64) {
	t.Helper()
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
		if !ok {
			continue
		}
		k = strings.TrimPrefix(k, "cmdstat_")
		if k == "info" || strings.HasPrefix(k, "config") {
			continue
		}
		n, _ := strconv.ParseInt(strings.SplitN(v, ",", 2)[0], 10, 64)
		calls += n
		if k == "eval" || k == "evalsha" {
			trips += n
		}
	}
	return calls, trips
}
