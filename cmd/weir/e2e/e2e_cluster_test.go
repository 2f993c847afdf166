//go:build linux

package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/vishvananda/netlink"

	"weir/bench"
	"weir/cmd/weir/api"
	"weir/cmd/weir/internal/cluster/clustertest"
	"weir/internal/netns"
	"weir/internal/testutil"
	"weir/internal/testutil/weirproc"
)

// Three weir instances behind ECMP sharing their limits and measurements
// through one real redis-server (issue 15), all real binaries:
//
//	router ns (clients)        198.18.0.10/32 nexthop via 198.18.11.2 dev r1
//	  r1 ⇄ u1  r2 ⇄ u2  r3 ⇄ u3                 nexthop via 198.18.12.2 dev r2
//	weir ns w1, w2, w3 (TUN weir0, VIP routes)   nexthop via 198.18.13.2 dev r3
//	  d1 ⇄ t1  d2 ⇄ t2  d3 ⇄ t3                 (fib_multipath_hash_policy=1)
//	target ns: backends 198.18.3.1..3 and redis-server 198.18.3.100:6379 on lo
//
// Each client connection's 5-tuple picks an instance; every instance dials
// the same three backends with host sockets (via: host).

// clusterLeaseInterval is the e2e lease interval: a dead instance's slots
// free after 3 of them.
const clusterLeaseInterval = 200 * time.Millisecond

// clusterSampling is the e2e sampling interval.
const clusterSampling = 2 * time.Second

const clusterConfig = `# e2e cluster instance %s
instance:
  recomputeInterval: 100ms
services:
  - name: web
    vips: [198.18.0.10]
    port: 80
    protocol: http
    limits:
      maxConnections: 10
      enforceConnections: true
    targets:
      - {name: t1, address: "198.18.3.1:8081", weight: 10, via: host, maxConnections: 4}
      - {name: t2, address: "198.18.3.2:8082", weight: 10, via: host}
      - {name: t3, address: "198.18.3.3:8083", weight: 10, via: host}
monitor:
  samplingInterval: 2s
  direction: toTarget
  scope: all
  lossRatioAndWeightFr: [20, 25]
  lossMaxWeightFr: 95
cluster:
  redis: 198.18.3.100:6379
  name: e2e
  instance: %s
  leaseInterval: 200ms
  # A borrow waits for the nudged members' renewals: the most allowed
  # (half the interval), not the default 20 ms, which a test machine
  # starved by a parallel load outlasts (the share-follows-demand check
  # then saw 80-88 % of its samples at 9 or more in 5 of 20 runs at load
  # average 20-30).
  borrowTimeout: 100ms
`

// ecmpRig is the topology above.
type ecmpRig struct {
	t       *testing.T
	bin     string
	config  string
	router  *netns.NS
	targets *netns.NS
	redis   *clustertest.Redis
	ws      []*netns.NS
	procs   []*weirproc.Proc
	backs   []*bench.Backend
	// web counts the requests in progress at the three backends together:
	// what the service's cluster-wide maxConnections bounds, read at once.
	web bench.Gauge
}

// sysctl writes value to /proc/sys/<key> (dots as slashes) inside ns.
func sysctl(ns *netns.NS, key, value string) error {
	return ns.Do(func() error {
		return os.WriteFile("/proc/sys/"+strings.ReplaceAll(key, ".", "/"), []byte(value+"\n"), 0o644)
	})
}

// vethLink connects a and b with a veth pair (nameA in a with addrA,
// nameB in b with addrB, both /24), up.
func vethLink(a, b *netns.NS, nameA, addrA, nameB, addrB string) error {
	if err := a.Do(func() error {
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: nameA}, PeerName: nameB}); err != nil {
			return fmt.Errorf("veth %s: %w", nameA, err)
		}
		la, err := netlink.LinkByName(nameA)
		if err != nil {
			return err
		}
		lb, err := netlink.LinkByName(nameB)
		if err != nil {
			return err
		}
		if err := netlink.LinkSetNsFd(lb, b.FD()); err != nil {
			return err
		}
		ad, _ := netlink.ParseAddr(addrA)
		if err := netlink.AddrAdd(la, ad); err != nil {
			return err
		}
		return netlink.LinkSetUp(la)
	}); err != nil {
		return err
	}
	return b.Do(func() error {
		lb, err := netlink.LinkByName(nameB)
		if err != nil {
			return err
		}
		ad, _ := netlink.ParseAddr(addrB)
		if err := netlink.AddrAdd(lb, ad); err != nil {
			return err
		}
		return netlink.LinkSetUp(lb)
	})
}

// runIn runs a command inside ns.
func runIn(ns *netns.NS, name string, args ...string) error {
	return ns.Do(func() error {
		out, err := exec.Command(name, args...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
		}
		return nil
	})
}

func newECMPRig(t *testing.T) *ecmpRig {
	t.Helper()
	rg := newECMPRigWith(t, rigOptions{config: clusterConfig, delay: time.Second})
	rg.startInstances()
	return rg
}

// rigOptions vary the rig: the instances' config (a template taking the
// instance id twice) and the backends' behaviour.
type rigOptions struct {
	config string
	delay  time.Duration   // each request's wait at the backend
	hold   <-chan struct{} // then held until closed (nil: not held)
}

// newECMPRigWith builds the topology and the backends, and starts no
// instance (startInstances does).
func newECMPRigWith(t *testing.T, o rigOptions) *ecmpRig {
	t.Helper()
	requireE2E(t)
	for _, c := range []string{"redis-server", "ip", "nft"} {
		if _, err := exec.LookPath(c); err != nil {
			t.Skipf("skipping: %s not installed (scripts/deps.sh installs it): the ECMP cluster test needs it", c)
		}
	}
	rg := &ecmpRig{t: t, bin: weirBinary(t), config: o.config, router: testutil.NetNS(t), targets: testutil.NetNS(t)}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(rg.targets.Do(func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		for _, a := range []string{"198.18.3.1/32", "198.18.3.2/32", "198.18.3.3/32", "198.18.3.100/32"} {
			ad, _ := netlink.ParseAddr(a)
			if err := netlink.AddrAdd(lo, ad); err != nil {
				return err
			}
		}
		return nil
	}))
	for _, k := range []string{"net.ipv4.conf.all.rp_filter", "net.ipv4.conf.default.rp_filter"} {
		must(sysctl(rg.router, k, "0"))
	}
	must(sysctl(rg.router, "net.ipv4.fib_multipath_hash_policy", "1"))
	nexthops := []string{"route", "add", "198.18.0.10/32"}
	for i := 1; i <= 3; i++ {
		w := testutil.NetNS(t)
		rg.ws = append(rg.ws, w)
		for _, k := range []string{"net.ipv4.conf.all.rp_filter", "net.ipv4.conf.default.rp_filter"} {
			must(sysctl(w, k, "0"))
		}
		must(sysctl(w, "net.ipv4.ip_forward", "1"))
		must(vethLink(rg.router, w, fmt.Sprintf("r%d", i), fmt.Sprintf("198.18.1%d.1/24", i), fmt.Sprintf("u%d", i), fmt.Sprintf("198.18.1%d.2/24", i)))
		must(vethLink(w, rg.targets, fmt.Sprintf("d%d", i), fmt.Sprintf("198.18.2%d.1/24", i), fmt.Sprintf("t%d", i), fmt.Sprintf("198.18.2%d.2/24", i)))
		must(runIn(w, "ip", "route", "add", "default", "via", fmt.Sprintf("198.18.1%d.1", i)))
		must(runIn(w, "ip", "route", "add", "198.18.3.0/24", "via", fmt.Sprintf("198.18.2%d.2", i)))
		nexthops = append(nexthops, "nexthop", "via", fmt.Sprintf("198.18.1%d.2", i), "dev", fmt.Sprintf("r%d", i))
	}
	must(runIn(rg.router, "ip", nexthops...))
	rg.redis = clustertest.StartRedisIn(t, rg.targets, "198.18.3.100")

	// Backends: a request takes 1 s, so that 30 clients keep every slot
	// busy; t1's MaxActive is what its maxConnections must bound.
	for i, a := range []string{"198.18.3.1:8081", "198.18.3.2:8082", "198.18.3.3:8083"} {
		b := &bench.Backend{Name: fmt.Sprintf("t%d", i+1), Delay: o.delay, Hold: o.hold, Group: &rg.web}
		ln, err := rg.targets.Listen("tcp", a)
		must(err)
		go b.Serve(ln)
		t.Cleanup(func() { b.Close(); ln.Close() })
		rg.backs = append(rg.backs, b)
	}
	return rg
}

// startInstances starts the three instances (w1, w2, w3, one per weir
// namespace) and waits until each sees all three sharing.
func (rg *ecmpRig) startInstances() {
	t := rg.t
	t.Helper()
	rg.procs = nil
	for i, w := range rg.ws {
		id := fmt.Sprintf("w%d", i+1)
		cfg := filepath.Join(t.TempDir(), "weir.yaml")
		if err := os.WriteFile(cfg, []byte(fmt.Sprintf(rg.config, id, id)), 0o644); err != nil {
			t.Fatal(err)
		}
		rg.procs = append(rg.procs, weirproc.Start(t, weirproc.Options{Binary: rg.bin, Config: cfg, NS: w, Ready: 30 * time.Second}))
	}
	for _, p := range rg.procs {
		rg.waitStatus(t, p, 15*time.Second, "3 members sharing", func(st api.Status) bool {
			c := st.Cluster
			return c != nil && c.Reachable && c.Mode == "shared" && len(c.Members) == 3
		})
	}
}

func (rg *ecmpRig) status(p *weirproc.Proc) (api.Status, error) {
	var st api.Status
	err := p.GetJSON("/status", &st)
	return st, err
}

func (rg *ecmpRig) waitStatus(t *testing.T, p *weirproc.Proc, d time.Duration, what string, ok func(api.Status) bool) api.Status {
	t.Helper()
	var st api.Status
	if !testutil.WithinEvery(d, 50*time.Millisecond, func() bool {
		var err error
		st, err = rg.status(p)
		return err == nil && ok(st)
	}) {
		t.Fatalf("after %v: not %s: %+v", d, what, st.Cluster)
	}
	return st
}

// load runs slow clients from the router namespace through the VIP.
func (rg *ecmpRig) load(ctx context.Context, clients int, d time.Duration, upload int) bench.Result {
	return bench.Load{Dial: rg.router.Dial, Addr: "198.18.0.10:80", Clients: clients, Duration: d, Timeout: 10 * time.Second, Upload: upload}.Run(ctx)
}

func clusterLevel(st api.Status, level, name string) (api.ClusterLevel, bool) {
	if st.Cluster == nil {
		return api.ClusterLevel{}, false
	}
	for _, l := range st.Cluster.Levels {
		if l.Level == level && l.Name == name {
			return l, true
		}
	}
	return api.ClusterLevel{}, false
}

// openSampler polls every instance's /status every 100 ms, all three at
// once, and keeps the sum of the web service's open connections over them.
type openSampler struct {
	mu   sync.Mutex
	sums []int64
	per  [][]int64
	stop chan struct{}
	done chan struct{}
}

func (rg *ecmpRig) sampleOpen(procs []*weirproc.Proc) *openSampler {
	s := &openSampler{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		tk := time.NewTicker(100 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-s.stop:
				return
			case <-tk.C:
			}
			// The three are read at once: read one after the other, a slot
			// that moved from one instance to the next between the reads
			// counted twice (a loaded machine stretched the reads enough
			// to see 12 of 10).
			var sum int64
			per := make([]int64, len(procs))
			errs := make([]error, len(procs))
			var wg sync.WaitGroup
			for i, p := range procs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					st, err := rg.status(p)
					if err != nil {
						errs[i] = err
						return
					}
					if l := statusLevel(st, "virtual server", "web"); l != nil {
						per[i] = l.Connections
					}
				}()
			}
			wg.Wait()
			ok := true
			for i := range procs {
				ok = ok && errs[i] == nil
				sum += per[i]
			}
			if ok {
				s.mu.Lock()
				s.sums = append(s.sums, sum)
				s.per = append(s.per, per)
				s.mu.Unlock()
			}
		}
	}()
	return s
}

// end stops the sampler and returns the sums seen.
func (s *openSampler) end() ([]int64, [][]int64) {
	close(s.stop)
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sums, s.per
}

// TestE2EClusterECMP: the scenarios on one rig, in order.
func TestE2EClusterECMP(t *testing.T) {
	rg := newECMPRig(t)

	t.Run("service limit 10 over three instances", func(t *testing.T) {
		outages := func() (n uint64) {
			for _, p := range rg.procs {
				if st, err := rg.status(p); err == nil && st.Cluster != nil {
					n += st.Cluster.Outages
				}
			}
			return n
		}
		before := outages()
		smp := rg.sampleOpen(rg.procs)
		res := rg.load(context.Background(), 30, 8*time.Second, 0)
		sums, per := smp.end()
		// A sample reads the three /status at once every 100 ms; on this
		// loaded test machine a round of three can take 300 ms.
		if len(sums) < 20 {
			t.Fatalf("only %d samples of /status in 8 s", len(sums))
		}
		// The steady part: after the first quarter (2 s at 80 samples),
		// before the last eighth (clients stop at 8 s).
		steady := sums[len(sums)/4 : len(sums)*7/8]
		// An instance whose renewals timed out twice in a row (a starved
		// host: half the 200 ms lease) runs on localShare while the others
		// still reach Redis: the documented overshoot, its share (3).
		bound := int64(10)
		if n := outages() - before; n > 0 {
			bound += 10 / 3
			t.Logf("%d outages (renewals timed out twice in a row) during the load: bound %d", n, bound)
		}
		lo, hi, at9 := int64(1<<62), int64(0), 0
		for _, s := range sums {
			hi = max(hi, s)
		}
		for _, s := range steady {
			lo = min(lo, s)
			if s >= 9 {
				at9++
			}
		}
		t.Logf("open over the 3 instances (every 100 ms): max %d, steady min %d, ≥9 in %d of %d steady samples; per instance at the peak %v; at the backends at once: peak %d; load %+v",
			hi, lo, at9, len(steady), per[len(per)/2], rg.web.Peak(), struct{ OK, Refused503, Failed, Reset int }{res.OK, res.Refused503, res.Failed, res.Reset})
		// The bound is judged where the requests are counted at once: the
		// three backends' common gauge. The sum of three /status reads is
		// not one moment (a loaded machine stretched a round of reads to
		// 300 ms and summed 11 of 10 in 2 of 20 runs).
		if p := rg.web.Peak(); p > bound {
			t.Errorf("%d requests at the backends at once over the three instances, enforced maxConnections 10 (bound %d)", p, bound)
		}
		if at9*10 < len(steady)*9 {
			t.Errorf("at least 9 open in only %d of %d steady samples (min %d): the slots do not follow the demand", at9, len(steady), lo)
		}
		spread := map[int]bool{}
		for _, p := range per {
			for i, n := range p {
				if n > 0 {
					spread[i] = true
				}
			}
		}
		if len(spread) != 3 {
			t.Errorf("ECMP used only instances %v", spread)
		}
		// The target shared by all: its backend never saw more than 4.
		if m := rg.backs[0].MaxActive(); m > 4 || m < 3 {
			t.Errorf("t1's backend saw %d requests at once, maxConnections 4 (cluster-wide)", m)
		} else {
			t.Logf("t1 (maxConnections 4): backend peak %d", m)
		}
	})

	t.Run("loss on one target: the same weight everywhere", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				rg.load(ctx, 12, 30*time.Second, 64<<10)
			}
		}()
		defer wg.Wait()
		// Uploads through every instance first: a clean interval each.
		time.Sleep(clusterSampling + time.Second)
		dropInput(t, rg.targets, "ip", "daddr", "198.18.3.2", "tcp", "dport", "8082")
		lossAt := time.Now()
		var first time.Duration = -1
		var weights []int
		ok := testutil.WithinEvery(8*clusterSampling, 50*time.Millisecond, func() bool {
			weights = weights[:0]
			cut := 0
			for _, p := range rg.procs {
				st, err := rg.status(p)
				if err != nil {
					return false
				}
				w := -1
				if s := statusService(st, "web"); s != nil {
					for _, tg := range s.Targets {
						if tg.Name == "t2" {
							w = tg.Effective
						}
					}
				}
				weights = append(weights, w)
				if w >= 0 && w < 10 {
					cut++
				}
			}
			if cut > 0 && first < 0 {
				first = time.Since(lossAt)
			}
			return cut == 3 && weights[0] == weights[1] && weights[1] == weights[2]
		})
		all := time.Since(lossAt)
		cancel()
		if !ok {
			t.Fatalf("t2's effective weights %v after %v of 5 %% loss: not cut to one weight on all three", weights, all)
		}
		spread := all - first
		t.Logf("5 %% loss toward t2: first instance cut after %v, all three at weight %d after %v (spread %v, sampling interval %v)",
			first.Round(time.Millisecond), weights[0], all.Round(time.Millisecond), spread.Round(time.Millisecond), clusterSampling)
		if spread > 2*clusterSampling {
			t.Errorf("the instances reached one weight %v apart, more than two sampling intervals", spread)
		}
		nftIn(t, rg.targets, "delete", "table", "inet", "weirhost")
	})

	t.Run("a failed connect: the target down everywhere", func(t *testing.T) {
		// t3's backend gone; clients inside w1's namespace reach w1 alone.
		rg.backs[2].Close()
		results := make(chan bench.Result, 1)
		go func() {
			results <- bench.Load{Dial: rg.ws[0].Dial, Addr: "198.18.0.10:80", Clients: 2, Requests: 20, Duration: 20 * time.Second, Timeout: 10 * time.Second}.Run(context.Background())
		}()
		defer func() { <-results }()
		target := func(st api.Status) api.Target {
			if s := statusService(st, "web"); s != nil {
				for _, tg := range s.Targets {
					if tg.Name == "t3" {
						return tg
					}
				}
			}
			return api.Target{}
		}
		rg.waitStatus(t, rg.procs[0], 10*time.Second, "t3 down at w1", func(st api.Status) bool { return target(st).Down && target(st).Failed > 0 })
		failedAt := time.Now()
		for i, p := range rg.procs[1:] {
			st := rg.waitStatus(t, p, 3*clusterSampling, fmt.Sprintf("t3 down at w%d, told by w1", i+2), func(st api.Status) bool { return target(st).Down })
			if f := target(st).Failed; f != 0 {
				t.Errorf("w%d itself failed %d connects to t3: the test did not isolate w1", i+2, f)
			}
		}
		t.Logf("t3 down at w1 after a failed connect: down at w2 and w3 %v later, without a connect of their own (sampling interval %v)",
			time.Since(failedAt).Round(time.Millisecond), clusterSampling)
	})

	t.Run("Redis killed and back", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		results := make(chan bench.Result, 1)
		go func() { results <- rg.load(ctx, 30, 30*time.Second, 0) }()
		time.Sleep(time.Second)
		rg.redis.Kill()
		for _, p := range rg.procs {
			rg.waitStatus(t, p, 5*time.Second, "on its local share", func(st api.Status) bool {
				l, ok := clusterLevel(st, "virtual server", "web")
				return !st.Cluster.Reachable && st.Cluster.Mode == "localShare" && ok && l.Share == 3
			})
		}
		// Every instance keeps serving on its share of 3. A connection
		// admitted under the lease before the outage may still be open (a
		// share bounds new admissions, it closes nothing): wait until those
		// are answered (a request takes 1 s).
		time.Sleep(1500 * time.Millisecond)
		picked := make([]uint64, len(rg.procs))
		for i, p := range rg.procs {
			st, _ := rg.status(p)
			picked[i], _ = pickedSum(st, "web")
		}
		smp := rg.sampleOpen(rg.procs)
		time.Sleep(3 * time.Second)
		sums, per := smp.end()
		for i, p := range rg.procs {
			st, _ := rg.status(p)
			n, _ := pickedSum(st, "web")
			if n <= picked[i] {
				t.Errorf("w%d served nothing while Redis was down", i+1)
			}
			// At least this one; a loaded host also times renewals out
			// (twice in a row: an outage) before or after it.
			if st.Cluster.Outages < 1 {
				t.Errorf("w%d: %d outages counted", i+1, st.Cluster.Outages)
			}
		}
		for j, s := range sums {
			for i, n := range per[j] {
				if n > 3 {
					t.Errorf("w%d: %d open on a local share of 3", i+1, n)
				}
			}
			if s > 10 {
				t.Errorf("%d open during the outage", s)
			}
		}
		rg.redis.Start()
		back := time.Now()
		for _, p := range rg.procs {
			rg.waitStatus(t, p, 10*time.Second, "sharing again", func(st api.Status) bool {
				return st.Cluster.Reachable && st.Cluster.Mode == "shared" && len(st.Cluster.Members) == 3
			})
		}
		grown := false
		testutil.WithinEvery(10*time.Second, 50*time.Millisecond, func() bool {
			for _, p := range rg.procs {
				if st, err := rg.status(p); err == nil {
					if l, ok := clusterLevel(st, "virtual server", "web"); ok && l.Share > 3 {
						grown = true
					}
				}
			}
			return grown
		})
		if !grown {
			t.Error("no instance took more than its local share after Redis came back")
		}
		t.Logf("Redis back: shared again and a share beyond 3 after %v", time.Since(back).Round(time.Millisecond))
		cancel()
		<-results
	})

	t.Run("an instance killed: its slots free within the lease time", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		results := make(chan bench.Result, 1)
		go func() { results <- rg.load(ctx, 30, 30*time.Second, 0) }()
		// w3 holds connections.
		rg.waitStatus(t, rg.procs[2], 10*time.Second, "w3 holding slots", func(st api.Status) bool {
			l, ok := clusterLevel(st, "virtual server", "web")
			return ok && l.Open > 0
		})
		rg.procs[2].Signal(os.Kill)
		killed := time.Now()
		if _, err := rg.procs[2].Wait(5 * time.Second); err != nil {
			t.Logf("w3: %v", err)
		}
		var d time.Duration
		var shares [2]int64
		ok := testutil.WithinEvery(10*time.Second, 20*time.Millisecond, func() bool {
			var sum int64
			members := 0
			for i, p := range rg.procs[:2] {
				st, err := rg.status(p)
				if err != nil {
					return false
				}
				l, _ := clusterLevel(st, "virtual server", "web")
				shares[i] = l.Share
				sum += l.Share
				members = max(members, len(st.Cluster.Members))
			}
			d = time.Since(killed)
			return sum >= 9 && members == 2
		})
		cancel()
		<-results
		if !ok {
			t.Fatalf("w3's slots never came back to w1 and w2: shares %v", shares)
		}
		ttl := 3 * clusterLeaseInterval
		t.Logf("w3 killed: w1 and w2 hold %v slots after %v (lease lifetime %v)", shares, d.Round(time.Millisecond), ttl)
		if d > ttl+4*clusterLeaseInterval {
			t.Errorf("slots free %v after the kill, lease lifetime %v", d, ttl)
		}
	})

	t.Run("Redis commands per instance", func(t *testing.T) {
		rdb := redis.NewClient(&redis.Options{Addr: rg.redis.Addr(), Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return rg.targets.Dial(ctx, network, addr)
		}})
		defer rdb.Close()
		ctx := context.Background()
		calls := func() map[string]int64 {
			out := map[string]int64{}
			info := rdb.Info(ctx, "commandstats").Val()
			for _, line := range strings.Split(info, "\n") {
				// cmdstat_evalsha:calls=12,usec=...
				if k, v, ok := strings.Cut(strings.TrimSpace(line), ":calls="); ok {
					var n int64
					fmt.Sscan(strings.SplitN(v, ",", 2)[0], &n)
					out[strings.TrimPrefix(k, "cmdstat_")] = n
				}
			}
			return out
		}
		rdb.ConfigResetStat(ctx)
		const d = 5 * time.Second
		time.Sleep(d)
		got := calls()
		var keys []string
		var total int64
		for k, n := range got {
			if k == "info" || strings.HasPrefix(k, "config") {
				continue
			}
			keys = append(keys, fmt.Sprintf("%s %d", k, n))
			total += n
		}
		sort.Strings(keys)
		// Two instances left; a round trip is one EVALSHA (EVAL when the
		// script was not loaded yet), the rest are the commands the
		// scripts run inside Redis.
		trips := float64(got["evalsha"]+got["eval"]) / d.Seconds() / 2
		cmds := float64(total) / d.Seconds() / 2
		t.Logf("idle, 2 instances, one service level and one target leased, lease 200 ms, sampling 2 s, no maxBandwidth level: "+
			"%.1f round trips/s and %.1f Redis commands/s per instance (%v)", trips, cmds, keys)
		// On paper: a renewal per lease interval (5/s) and a samples
		// exchange per sampling interval (0.5/s).
		if trips < 4 || trips > 8 {
			t.Errorf("%.1f round trips/s per instance, want about 5.5", trips)
		}
	})
}
