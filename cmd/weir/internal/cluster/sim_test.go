package cluster

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

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
}

// drive runs in its own goroutine until stop: every 5 ms it admits until
// open reaches want (or the share refuses) and releases what is above it.
func (n *simNode) drive(stop <-chan struct{}, wg *sync.WaitGroup) {
	defer wg.Done()
	vs := n.cfg.ServiceByName("web")
	tk := time.NewTicker(5 * time.Millisecond)
	defer tk.Stop()
	for {
		select {
		case <-stop:
			for i := range n.held {
				n.held[i].Release()
			}
			n.open.Store(0)
			return
		case <-tk.C:
		}
		w := n.want.Load()
		for int64(len(n.held)) > w {
			n.held[len(n.held)-1].Release()
			n.held = n.held[:len(n.held)-1]
		}
		for int64(len(n.held)) < w {
			n.held = append(n.held, policy.Ticket{})
			if _, ok := n.adm.Admit(vs, &n.held[len(n.held)-1]); !ok {
				n.held = n.held[:len(n.held)-1]
				break
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
	const (
		members = 100
		limit   = 1000
		lease   = 500 * time.Millisecond
	)
	nodes := make([]*simNode, members)
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
		n := &simNode{cfg: cfg, adm: policy.NewAdmission(cfg, 0)}
		n.c, err = New(Options{Config: *cfg.Cluster, Admission: n.adm})
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

	var peak atomic.Int64
	sum := func(ns []*simNode) int64 {
		var s int64
		for _, n := range ns {
			s += n.open.Load()
		}
		return s
	}
	// phase sets the wants, waits for 95 % of the limit on the nodes that
	// want, then watches the slack for 10 lease intervals.
	phase := func(name string, wants func(i int) int64, on []*simNode) {
		t.Helper()
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
	phase("100 instances wanting 15 each (1500 for 1000)", func(int) int64 { return 15 }, nodes)
	phase("demand moved: 10 instances wanting 200 each, 90 idle", func(i int) int64 {
		if i < 10 {
			return 200
		}
		return 0
	}, nodes[:10])
	if p := peak.Load(); p > limit {
		t.Errorf("%d open over the cluster, limit %d", p, limit)
	}
	var renewals uint64
	for _, n := range nodes {
		renewals += n.c.Status().Renewals
	}
	t.Logf("peak %d of %d; %d renewals in all", peak.Load(), limit, renewals)
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
