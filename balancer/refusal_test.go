package balancer

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"weir/policy"
)

func TestBackupsOnlyWhenNoPrimaryCan(t *testing.T) {
	// Configured order interleaves roles on purpose: the roles decide.
	vs := makeVS("p1:1:max=1", "b1:1:backup:max=1", "p2:1:max=1", "b2:5:backup:max=2")
	b := mustNew(t, vs, policy.BalancerSettings{})
	var leases []Lease
	pick := func() string {
		l, err := b.PickAction(t0, 0, nil, nil)
		if err != nil {
			return "refused: " + err.Error()
		}
		leases = append(leases, l)
		return l.Name()
	}
	var got []string
	for range 6 {
		got = append(got, pick())
	}
	want := []string{"p1", "p2", "b1", "b2", "b2",
		"refused: all targets unavailable: p1 (at limit 1/1), p2 (at limit 1/1), b1 (at limit 1/1), b2 (at limit 2/2)"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("picks\n%q\nwant\n%q", got, want)
	}
	for _, l := range leases {
		if (l.Name()[0] == 'b') != l.Backup() {
			t.Errorf("%s: Backup() = %v", l.Name(), l.Backup())
		}
	}
	// A primary frees up: it is chosen again before the backups.
	leases[0].Release()
	if got := pick(); got != "p1" {
		t.Errorf("after p1 released: %s, want p1", got)
	}
	// A primary down and the others full: first backup with room, in order.
	leases[2].Release() // b1
	if got := pick(); got != "b1" {
		t.Errorf("after b1 released: %s, want b1", got)
	}
}

func TestMaxConnectionsUnderConcurrency(t *testing.T) {
	for _, algo := range []policy.Algorithm{policy.RoundRobin, policy.LeastConn, policy.Maglev} {
		t.Run(algo.String(), func(t *testing.T) {
			vs := makeVS("a:3:max=3", "b:1:max=4", "c:2:max=2", "z:1:backup:max=1")
			b := mustNew(t, vs, policy.BalancerSettings{Algorithm: algo})
			limit := map[string]int64{"a": 3, "b": 4, "c": 2, "z": 1}
			var live sync.Map // name → *atomic.Int64, counted independently of the balancer
			for name := range limit {
				live.Store(name, new(atomic.Int64))
			}
			var served, refused atomic.Int64
			var wg sync.WaitGroup
			var bad atomic.Value
			for g := range 16 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range 2000 {
						l, err := b.PickAction(t0, mix(uint64(g*100000+i)), nil, nil)
						if err != nil {
							var nt *NoTargetError
							if !errors.As(err, &nt) {
								bad.Store(err.Error())
							}
							refused.Add(1)
							continue
						}
						c, _ := live.Load(l.Name())
						if n := c.(*atomic.Int64).Add(1); n > limit[l.Name()] {
							bad.Store(fmt.Sprintf("%s has %d open, limit %d", l.Name(), n, limit[l.Name()]))
						}
						served.Add(1)
						if i%3 == 0 {
							time.Sleep(time.Microsecond)
						}
						c.(*atomic.Int64).Add(-1)
						l.Release()
					}
				}()
			}
			wg.Wait()
			if v := bad.Load(); v != nil {
				t.Fatal(v)
			}
			for _, ts := range b.Snapshot(t0).Targets {
				if ts.Open != 0 {
					t.Errorf("%s: %d open after all released", ts.Name, ts.Open)
				}
			}
			t.Logf("served %d, refused %d", served.Load(), refused.Load())
		})
	}
}

// TestWebSphereSeed replays the WebSphere plug-in scenario: wasmember05 with
// MaxConnections 3 and wasmember06 with 4, 30 concurrent slow clients. At most
// 7 are served at once, the rest get the 503 reason naming both members at
// their limit, and each member serves again once its backlog drains.
func TestWebSphereSeed(t *testing.T) {
	vs := makeVS("wasmember05:1:max=3", "wasmember06:1:max=4")
	b := mustNew(t, vs, policy.BalancerSettings{})
	const clients = 30
	type result struct {
		l   Lease
		err error
	}
	results := make(chan result, clients)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			l, err := b.PickAction(t0, uint64(i), nil, nil)
			results <- result{l, err}
		}()
	}
	close(start)
	wg.Wait()
	close(results)
	var held []Lease
	perMember := map[string]int{}
	const reason = "all targets unavailable: wasmember05 (at limit 3/3), wasmember06 (at limit 4/4)"
	for r := range results {
		if r.err != nil {
			if r.err.Error() != reason {
				t.Errorf("refusal %q, want %q", r.err, reason)
			}
			continue
		}
		held = append(held, r.l)
		perMember[r.l.Name()]++
	}
	if len(held) != 7 || perMember["wasmember05"] != 3 || perMember["wasmember06"] != 4 {
		t.Fatalf("served %d (%v), want 7: 3 on wasmember05 and 4 on wasmember06", len(held), perMember)
	}
	st := b.Snapshot(t0)
	if st.Refused != clients-7 {
		t.Errorf("Refused = %d, want %d", st.Refused, clients-7)
	}
	for _, ts := range st.Targets {
		if ts.SkippedAtLimit == 0 {
			t.Errorf("%s: SkippedAtLimit 0, want the skips counted", ts.Name)
		}
	}
	// wasmember05 works off its backlog: it is back in business while
	// wasmember06 is still at its limit.
	for _, l := range held {
		if l.Name() == "wasmember05" {
			l.Release()
		}
	}
	for range 3 {
		l, err := b.PickAction(t0, 0, nil, nil)
		if err != nil || l.Name() != "wasmember05" {
			t.Fatalf("after wasmember05 drained: %q, %v", l.Name(), err)
		}
		l.Release()
	}
	// wasmember06 drains below 4: both serve again, interleaved.
	for _, l := range held {
		if l.Name() == "wasmember06" {
			l.Release()
		}
	}
	got := countPicks(t, b, 10, t0)
	if got["wasmember05"] != 5 || got["wasmember06"] != 5 {
		t.Errorf("after both drained: %v, want 5 each", got)
	}
}

func TestFailedAndRetry(t *testing.T) {
	s := policy.BalancerSettings{RetryInterval: 5 * time.Second, MaxAttempts: 3}
	b := mustNew(t, makeVS("a", "b", "c", "d", "z:1:backup"), s)
	var tried Tried
	var names []string
	for {
		l, err := b.PickAction(t0, 0, nil, &tried)
		if err != nil {
			want := "gave up after 3 attempts: a (down until 12:00:05), b (down until 12:00:05), c (down until 12:00:05)"
			if err.Error() != want {
				t.Errorf("error %q, want %q", err, want)
			}
			var nt *NoTargetError
			if !errors.As(err, &nt) || !nt.Exhausted || nt.Attempts != 3 {
				t.Errorf("error %#v, want exhausted after 3", err)
			}
			break
		}
		names = append(names, l.Name())
		l.Failed(t0)
		if l.Held() {
			t.Errorf("lease still held after Failed")
		}
	}
	if got := strings.Join(names, ","); got != "a,b,c" {
		t.Errorf("tried %s, want a,b,c", got)
	}
	// A new connection: a, b and c are down, d serves; then the backup.
	l, err := b.PickAction(t0.Add(time.Second), 0, nil, nil)
	if err != nil || l.Name() != "d" {
		t.Fatalf("pick: %q, %v; want d", l.Name(), err)
	}
	l.Failed(t0.Add(time.Second))
	l, err = b.PickAction(t0.Add(time.Second), 0, nil, nil)
	if err != nil || l.Name() != "z" || !l.Backup() {
		t.Fatalf("pick: %q, %v; want backup z", l.Name(), err)
	}
	l.Release()
	// Retry intervals over: all four are back.
	got := countPicks(t, b, 40, t0.Add(6*time.Second))
	if got["a"] != 10 || got["b"] != 10 || got["c"] != 10 || got["d"] != 10 {
		t.Errorf("after retry interval: %v", got)
	}
}

func TestPickExceptSkipsTriedButOthersMayServe(t *testing.T) {
	b := mustNew(t, makeVS("a:1:max=1", "b"), policy.BalancerSettings{MaxAttempts: 5})
	var tried Tried
	l1, err := b.PickAction(t0, 0, nil, &tried)
	if err != nil || l1.Name() != "a" {
		t.Fatalf("first: %q %v", l1.Name(), err)
	}
	l1.Release() // say the connection was reset: try another target
	l2, err := b.PickAction(t0, 0, nil, &tried)
	if err != nil || l2.Name() != "b" {
		t.Fatalf("second: %q %v", l2.Name(), err)
	}
	l2.Release()
	_, err = b.PickAction(t0, 0, nil, &tried)
	want := "all targets unavailable: a (already tried), b (already tried)"
	if err == nil || err.Error() != want {
		t.Errorf("third: %v, want %q", err, want)
	}
	if tried.Len() != 2 {
		t.Errorf("tried %d, want 2", tried.Len())
	}
}

func TestNoTargetErrorText(t *testing.T) {
	for _, tc := range []struct {
		name  string
		specs []string
		setup func(b *Balancer)
		want  string
	}{
		{"no targets", nil, func(*Balancer) {}, "all targets unavailable: no targets configured"},
		{"mixed", []string{"a:1:max=3", "b:1", "c:1:max=1"}, func(b *Balancer) {
			b.SetWeights(map[string]int{"c": 0})
			for range 3 {
				l, _ := b.PickAction(t0, 0, nil, nil)
				if l.Name() == "b" {
					l.Failed(t0)
				}
			}
			for range 3 {
				b.PickAction(t0, 0, nil, nil)
			}
		}, "all targets unavailable: a (at limit 3/3), b (down until 12:00:05), c (at limit 1/1)"},
		{"health", []string{"a"}, func(b *Balancer) {
			for range 3 {
				b.ReportHealth("a", false, t0)
			}
		}, "all targets unavailable: a (health check failed)"},
		{"many", []string{"t00:1:max=0", "t01", "t02", "t03", "t04", "t05", "t06", "t07", "t08", "t09", "t10", "t11", "t12", "t13", "t14", "t15", "t16", "t17"}, func(b *Balancer) {
			for range 18 {
				l, _ := b.PickAction(t0, 0, nil, nil)
				l.Failed(t0)
			}
		}, "all targets unavailable: t00 (down until 12:00:05), t01 (down until 12:00:05), t02 (down until 12:00:05), t03 (down until 12:00:05), t04 (down until 12:00:05), t05 (down until 12:00:05), t06 (down until 12:00:05), t07 (down until 12:00:05), t08 (down until 12:00:05), t09 (down until 12:00:05), t10 (down until 12:00:05), t11 (down until 12:00:05), t12 (down until 12:00:05), t13 (down until 12:00:05), t14 (down until 12:00:05), t15 (down until 12:00:05) and 2 more"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := mustNew(t, makeVS(tc.specs...), policy.BalancerSettings{RetryInterval: 5 * time.Second})
			tc.setup(b)
			_, err := b.PickAction(t0, 0, nil, nil)
			var nt *NoTargetError
			if !errors.As(err, &nt) {
				t.Fatalf("error %v, want *NoTargetError", err)
			}
			if err.Error() != tc.want {
				t.Errorf("error\n%q\nwant\n%q", err, tc.want)
			}
			if nt.Service != "vs" {
				t.Errorf("Service %q", nt.Service)
			}
		})
	}
}

func TestLeaseZeroAndAfterRelease(t *testing.T) {
	var zero Lease
	zero.Release()
	zero.Failed(t0)
	if zero.Held() || zero.Target() != nil || zero.Name() != "" || zero.Backup() {
		t.Errorf("zero lease: %+v", zero)
	}
	b := mustNew(t, makeVS("a:1:max=1"), policy.BalancerSettings{})
	l, err := b.PickAction(t0, 0, nil, nil)
	if err != nil || !l.Held() {
		t.Fatalf("pick: %v, held %v", err, l.Held())
	}
	l.Release()
	l.Failed(t0) // after Release: no-op, a stays up
	if l.Held() || l.Name() != "a" || l.Target().Name != "a" {
		t.Errorf("after release: held %v, name %q", l.Held(), l.Name())
	}
	if st := b.Snapshot(t0).Targets[0]; st.Open != 0 || st.Down || st.Failed != 0 {
		t.Errorf("after release and late Failed: %+v", st)
	}
}
