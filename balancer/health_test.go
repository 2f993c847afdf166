package balancer

import (
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	"weir/policy"
)

func TestHealthRiseFall(t *testing.T) {
	for _, tc := range []struct {
		name       string
		rise, fall int
		results    string // + ok, - failed
		states     string // U up, D down after each result
	}{
		{"fall 3", 2, 3, "--+---", "UUUUUD"},
		{"rise 2", 2, 3, "---+-++", "UUDDDDU"},
		{"flapping never settles", 2, 3, "-+-+-+-+", "UUUUUUUU"},
		{"rise and fall 1", 1, 1, "-+-+", "DUDU"},
		{"zero counts as 1", 0, 0, "-+", "DU"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var h Health
			var got strings.Builder
			changes := 0
			for _, r := range tc.results {
				if h.Report(r == '+', tc.rise, tc.fall) {
					changes++
				}
				if h.Up() {
					got.WriteByte('U')
				} else {
					got.WriteByte('D')
				}
			}
			if got.String() != tc.states {
				t.Errorf("states %s, want %s", got.String(), tc.states)
			}
			want := 0
			for i := 1; i < len(tc.states); i++ {
				if tc.states[i] != tc.states[i-1] {
					want++
				}
			}
			if tc.states[0] == 'D' {
				want++
			}
			if changes != want {
				t.Errorf("%d changes reported, want %d", changes, want)
			}
		})
	}
}

func TestReportHealthTakesTargetOutAndBack(t *testing.T) {
	s := policy.BalancerSettings{Health: policy.HealthCheck{Interval: time.Second, Rise: 2, Fall: 2}}
	b := mustNew(t, makeVS("a", "b"), s)
	for i, want := range []struct{ up, changed bool }{{true, false}, {false, true}} {
		up, changed := b.ReportHealth("a", false, t0)
		if up != want.up || changed != want.changed {
			t.Errorf("failure %d: up %v changed %v, want %v %v", i+1, up, changed, want.up, want.changed)
		}
	}
	if got := countPicks(t, b, 10, t0); got["b"] != 10 {
		t.Errorf("a health-down: %v, want all on b", got)
	}
	if st := b.Snapshot(t0).Targets[0]; st.HealthUp {
		t.Errorf("snapshot says a is up")
	}
	b.ReportHealth("a", true, t0)
	b.ReportHealth("a", true, t0)
	if got := countPicks(t, b, 10, t0); got["a"] != 5 {
		t.Errorf("a back up: %v, want 5 each", got)
	}
	if up, changed := b.ReportHealth("nosuch", true, t0); up || changed {
		t.Errorf("unknown target: %v %v", up, changed)
	}
	// Both down: the refusal names each target's reason.
	for range 2 {
		b.ReportHealth("a", false, t0)
		b.ReportHealth("b", false, t0)
	}
	if _, err := b.PickAction(t0, 0, nil, nil); err == nil || !strings.Contains(err.Error(), "a (health check failed), b (health check failed)") {
		t.Errorf("pick with both down: %v", err)
	}
}

// share picks n times at now (releasing each) and returns the fraction that
// went to name.
func share(t *testing.T, b *Balancer, name string, n int, now time.Time) float64 {
	t.Helper()
	return float64(countPicks(t, b, n, now)[name]) / float64(n)
}

func TestSlowStartAfterFailedConnect(t *testing.T) {
	const retry, window = 10 * time.Second, 100 * time.Second
	for _, algo := range []policy.Algorithm{policy.RoundRobin, policy.Maglev} {
		t.Run(algo.String(), func(t *testing.T) {
			s := policy.BalancerSettings{Algorithm: algo, RetryInterval: retry, SlowStart: window}
			b := mustNew(t, makeVS("a", "b"), s)
			for {
				l, err := b.PickAction(t0, 0, nil, nil)
				if err != nil {
					t.Fatal(err)
				}
				if l.Name() == "b" {
					l.Failed(t0)
					break
				}
				l.Release()
			}
			back := t0.Add(retry)
			for _, tc := range []struct {
				at     time.Duration // after b is back
				factor float64
			}{
				{0, 0.1}, {window / 2, 0.55}, {window * 9 / 10, 0.91}, {window, 1}, {2 * window, 1},
			} {
				now := back.Add(tc.at)
				got := share(t, b, "b", 100000, now)
				// Thinning with factor f gives b the share f·w_b/(w_a+f·w_b).
				want := tc.factor / (1 + tc.factor)
				if math.Abs(got-want) > 0.01 {
					t.Errorf("%v after b came back: share %.4f, want %.4f (factor %.2f)", tc.at, got, want, tc.factor)
				}
				if f := b.Snapshot(now).Targets[1].SlowStart; math.Abs(f-tc.factor) > 0.001 {
					t.Errorf("%v after: snapshot factor %.3f, want %.3f", tc.at, f, tc.factor)
				}
			}
			// Thinning never refuses: with only b weighted, b in slow start
			// takes every connection.
			b.SetWeights(map[string]int{"a": 0})
			if got := share(t, b, "b", 1000, back); got != 1 {
				t.Errorf("only b weighted, in slow start: share %.3f, want 1", got)
			}
		})
	}
}

func TestSlowStartLeastConnAndHealth(t *testing.T) {
	const window = 100 * time.Second
	s := policy.BalancerSettings{Algorithm: policy.LeastConn, SlowStart: window, Health: policy.HealthCheck{Interval: time.Second, Rise: 1, Fall: 1}}
	b := mustNew(t, makeVS("a", "b"), s)
	b.ReportHealth("b", false, t0)
	b.ReportHealth("b", true, t0.Add(time.Second)) // back: ramp starts here
	// Holding connections at factor 0.1, b gets a tenth of a's.
	open := map[string]int{}
	for range 110 {
		l, err := b.PickAction(t0.Add(time.Second), 0, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		open[l.Name()]++
	}
	if open["a"] != 100 || open["b"] != 10 {
		t.Errorf("held at factor 0.1: %v, want a 100, b 10", open)
	}
	// At full weight b catches up.
	for range 90 {
		b.PickAction(t0.Add(time.Second+window), 0, nil, nil)
	}
	if st := b.Snapshot(t0.Add(time.Second + window)).Targets; st[0].Open != 100 || st[1].Open != 100 {
		t.Errorf("after the window: a %d, b %d open, want 100 each", st[0].Open, st[1].Open)
	}
}

func TestSnapshot(t *testing.T) {
	vs := makeVS("a:4:max=2", "z:1:backup")
	b := mustNew(t, vs, policy.BalancerSettings{RetryInterval: 5 * time.Second})
	b.SetWeights(map[string]int{"a": 2})
	l, _ := b.PickAction(t0, 0, nil, nil) // a
	l2, _ := b.PickAction(t0, 0, nil, nil)
	l2.Failed(t0) // a down until 12:00:05, one open (l)
	for range 2 {
		b.PickAction(t0, 0, nil, nil) // the backup z, held
	}
	defer l.Release()
	got := b.Snapshot(t0.Add(time.Second))
	if got.Service != "vs" || got.Algorithm != policy.RoundRobin {
		t.Errorf("service %q algorithm %v", got.Service, got.Algorithm)
	}
	a, z := got.Targets[0], got.Targets[1]
	want := TargetStatus{Name: "a", Addr: vs.Targets[0].Addr, Role: policy.RolePrimary, Weight: 4, Effective: 2, Exact: 2, SlowStart: 1,
		Open: 1, Max: 2, Capacity: -1, Down: true, DownUntil: t0.Add(5 * time.Second), HealthUp: true, Picked: 2, Failed: 1}
	if !reflect.DeepEqual(a, want) {
		t.Errorf("a:\n%+v\nwant\n%+v", a, want)
	}
	if z.Name != "z" || z.Role != policy.RoleBackup || z.Open != 2 || z.Picked != 2 || z.Down {
		t.Errorf("z: %+v", z)
	}
	if got.Refused != 0 {
		t.Errorf("Refused %d, want 0", got.Refused)
	}
}

func TestReloadTurningChecksOffForgetsHealth(t *testing.T) {
	on := policy.BalancerSettings{Health: policy.HealthCheck{Interval: time.Second, Rise: 2, Fall: 1}}
	b := mustNew(t, makeVS("a", "b"), on)
	b.ReportHealth("a", false, t0)
	b.Update(compile(t, makeVS("a", "b"), on))
	if got := countPicks(t, b, 4, t0); got["a"] != 0 {
		t.Errorf("checks still on: a got %d picks while health-down", got["a"])
	}
	b.Update(compile(t, makeVS("a", "b"), policy.BalancerSettings{}))
	if got := countPicks(t, b, 4, t0); got["a"] != 2 {
		t.Errorf("checks off: a got %d of 4 picks, want 2", got["a"])
	}
}
