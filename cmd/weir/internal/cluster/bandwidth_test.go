package cluster

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"weir/policy"
)

// bytesOf is a policy.ByteTotals with one virtual server's running total.
type bytesOf struct{ n uint64 }

func (b *bytesOf) ServiceBytes(string) (uint64, bool) { return b.n, true }

// bwNode is an instance whose service "web" has an enforced maxBandwidth
// of limit bytes per second over a 30 s window; its clock is the test's.
type bwNode struct {
	adm   *policy.Admission
	cfg   *policy.Config
	c     *Cluster
	bytes bytesOf
}

func newBWNode(t *testing.T, redisAddr, id string, limit int64, down policy.RedisDown) *bwNode {
	t.Helper()
	cfg, err := policy.Compile(&policy.Config{
		Instance: policy.Instance{MetricInterval: 30 * time.Second, RecomputeInterval: 100 * time.Millisecond},
		Services: []*policy.VirtualServer{{
			Name: "web", VIPs: []netip.Addr{netip.MustParseAddr("198.18.0.1")}, Ports: policy.PortRange{Lo: 80, Hi: 80},
			Limits:  policy.Limits{MaxBandwidth: limit, EnforceBandwidth: true},
			Targets: []*policy.Target{{Addr: netip.MustParseAddrPort("198.18.1.1:80"), Weight: 1}},
		}},
		Cluster: &policy.Cluster{Redis: redisAddr, Name: "test", Instance: id, LeaseInterval: interval, OnRedisDown: down},
	})
	if err != nil {
		t.Fatal(err)
	}
	n := &bwNode{cfg: cfg, adm: policy.NewAdmission(cfg, 16)}
	n.c, err = New(Options{Config: *cfg.Cluster, Admission: n.adm})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.c.Close() })
	return n
}

// step recomputes at now and shares the rates, as the recompute loop does.
func (n *bwNode) step(now time.Time) {
	n.adm.Recompute(now, &n.bytes)
	n.c.ShareBandwidth(context.Background())
}

func (n *bwNode) admit() (policy.Refusal, bool) {
	var tk policy.Ticket
	r, ok := n.adm.Admit(n.cfg.ServiceByName("web"), &tk)
	tk.Release()
	return r, ok
}

// TestBandwidthClusterWide: Sun's example on two instances, each 5000
// bytes at t=1 s over a 30 s window (166 B/s each), against one enforced
// maxBandwidth of 300 B/s: alone each is under it, together (332 B/s)
// both refuse, one recompute interval after the other's bytes were
// published; the status shows both figures. With Redis gone, localShare
// takes the other member to use as much (332 B/s: refused) and failOpen
// judges the local rate alone; when the window empties both admit.
func TestBandwidthClusterWide(t *testing.T) {
	r := startRedis(t)
	a := newBWNode(t, r.Addr(), "a", 300, policy.LocalShare)
	b := newBWNode(t, r.Addr(), "b", 300, policy.FailOpen)
	for range 2 {
		a.c.Renew(context.Background())
		b.c.Renew(context.Background())
	}
	t0 := time.Unix(1000, 0)
	a.step(t0)
	b.step(t0)
	a.bytes.n += 5000
	a.step(t0.Add(time.Second))
	b.step(t0.Add(time.Second))
	if _, ok := a.admit(); !ok {
		t.Fatal("a refused at 166 B/s alone")
	}
	b.bytes.n += 5000
	b.step(t0.Add(1100 * time.Millisecond)) // b: 166 here + 166 from a
	if r, ok := b.admit(); ok || r.Measured != 332 {
		t.Errorf("b at 166+166 B/s: %v %v, want refused at 332", ok, r)
	}
	a.step(t0.Add(1100 * time.Millisecond)) // a reads b's 166
	if r, ok := a.admit(); ok || r.Measured != 332 {
		t.Errorf("a at 166+166 B/s: %v %v, want refused at 332", ok, r)
	}
	st := a.c.Status()
	if len(st.Bandwidth) != 1 || st.Bandwidth[0].Local != 166 || st.Bandwidth[0].Others != 166 || st.BandwidthRounds != 3 {
		t.Errorf("status %+v", st)
	}

	// Redis gone: after two failed publications the fallbacks.
	r.Kill()
	for i := range 2 {
		a.step(t0.Add(time.Duration(1200+100*i) * time.Millisecond))
		b.step(t0.Add(time.Duration(1200+100*i) * time.Millisecond))
	}
	a.step(t0.Add(1400 * time.Millisecond))
	b.step(t0.Add(1400 * time.Millisecond))
	if _, ok := a.admit(); ok {
		t.Error("localShare: a admitted at 166 B/s with one other member supposed as busy (limit 300)")
	}
	if r, ok := b.admit(); !ok {
		t.Errorf("failOpen: b refused on its own 166 B/s: %v", r)
	}
	if st := a.c.Status(); st.BandwidthFallbacks == 0 || st.Bandwidth[0].Others != 166 {
		t.Errorf("a's status in the outage %+v", st.Bandwidth)
	}
	// Back: the window has aged out (t=32 s), the sum is 0.
	r.Start()
	late := t0.Add(32 * time.Second)
	for range 3 {
		a.step(late)
		b.step(late)
	}
	if _, ok := a.admit(); !ok {
		t.Errorf("a refused after the window emptied: %+v", a.c.Status().Bandwidth)
	}
	if st := b.c.Status(); st.Bandwidth[0].Others != 0 || st.Bandwidth[0].Local != 0 {
		t.Errorf("b after Redis came back: %+v", st.Bandwidth)
	}
}

// TestLoggedConnsClusterWide: a maxConnections that is only logged is not
// leased (every connection admitted), but its log line counts the
// cluster: 2 open on each of two instances cross a logged 3.
func TestLoggedConnsClusterWide(t *testing.T) {
	r := startRedis(t)
	mk := func(id string) (*policy.Admission, *policy.Config, *Cluster) {
		cfg, err := policy.Compile(&policy.Config{
			Services: []*policy.VirtualServer{{
				Name: "web", VIPs: []netip.Addr{netip.MustParseAddr("198.18.0.1")}, Ports: policy.PortRange{Lo: 80, Hi: 80},
				Limits:  policy.Limits{MaxConnections: 3},
				Targets: []*policy.Target{{Addr: netip.MustParseAddrPort("198.18.1.1:80"), Weight: 1}},
			}},
			Cluster: &policy.Cluster{Redis: r.Addr(), Name: "test", Instance: id, LeaseInterval: interval},
		})
		if err != nil {
			t.Fatal(err)
		}
		adm := policy.NewAdmission(cfg, 16)
		c, err := New(Options{Config: *cfg.Cluster, Admission: adm})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		c.Renew(context.Background())
		return adm, cfg, c
	}
	aa, ca, a := mk("a")
	ab, cb, b := mk("b")
	tk := make([]policy.Ticket, 4)
	for i := range 2 {
		if _, ok := aa.Admit(ca.ServiceByName("web"), &tk[i]); !ok {
			t.Fatal("a refused under a logged limit")
		}
		if _, ok := ab.Admit(cb.ServiceByName("web"), &tk[2+i]); !ok {
			t.Fatal("b refused under a logged limit")
		}
	}
	a.ShareBandwidth(context.Background())
	b.ShareBandwidth(context.Background()) // b reads a's 2
	ab.Recompute(time.Unix(1, 0), nil)
	select {
	case e := <-ab.Events():
		if !e.Over || e.Measured != 4 {
			t.Errorf("b's event %+v, want over at 4", e)
		}
	default:
		t.Error("b logged nothing with 4 open over the cluster for a logged 3")
	}
	if st := b.Status(); len(st.Logged) != 1 || st.Logged[0].Open != 2 || st.Logged[0].Others != 2 {
		t.Errorf("b's status %+v", st.Logged)
	}
	for i := range tk {
		tk[i].Release()
	}
}
