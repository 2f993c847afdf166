package balancer

import (
	"strings"
	"sync"
	"testing"
	"time"

	"weir/policy"
)

// ejectionSettings: retryInterval 1 ms, so a failed connect keeps a target
// down only until the next step of the manual clock and ejection alone
// decides whether it stays out.
func ejectionSettings(maxPercent int, serverErrors bool) policy.BalancerSettings {
	return policy.BalancerSettings{RetryInterval: time.Millisecond,
		Ejection: policy.Ejection{ConsecutiveFailures: 5, For: 30 * time.Second, MaxPercent: maxPercent, ServerErrors: serverErrors}}
}

// recorder collects the ejections a balancer reports.
type recorder struct {
	mu sync.Mutex
	ev []Ejection
}

func (r *recorder) hear(e Ejection) { r.mu.Lock(); r.ev = append(r.ev, e); r.mu.Unlock() }
func (r *recorder) events() []Ejection {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Ejection(nil), r.ev...)
}

// failConnect picks at now until the pick is name (releasing the others)
// and reports its connect failed; false when name cannot be picked.
func failConnect(t *testing.T, b *Balancer, name string, now time.Time) bool {
	t.Helper()
	for i := range 64 {
		l, err := b.PickAction(now, mix(uint64(i)), nil, nil)
		if err != nil {
			t.Fatalf("pick: %v", err)
		}
		if l.Name() == name {
			l.Failed(now)
			return true
		}
		l.Release()
	}
	return false
}

func TestEjectionAfterConsecutiveConnectFailures(t *testing.T) {
	b := mustNew(t, makeVS("a", "b"), ejectionSettings(50, false))
	var rec recorder
	b.OnEject(rec.hear)
	now := t0
	step := func() { now = now.Add(2 * time.Millisecond) } // past the retry interval
	// Four failures, a success, four failures: no run of five.
	for range 4 {
		if !failConnect(t, b, "a", now) {
			t.Fatal("a not pickable before its ejection")
		}
		step()
	}
	b.Report("a", true, now)
	for range 4 {
		failConnect(t, b, "a", now)
		step()
	}
	if st := b.Snapshot(now).Targets[0]; st.Ejected || st.Consecutive != 4 {
		t.Fatalf("after 4+success+4 failures: ejected %v, run %d; want not ejected, run 4", st.Ejected, st.Consecutive)
	}
	// The fifth in a row ejects it for 30 s.
	failConnect(t, b, "a", now)
	ejectedAt := now
	step()
	st := b.Snapshot(now).Targets[0]
	if !st.Ejected || st.Ejections != 1 || !st.EjectedUntil.Equal(ejectedAt.Add(30*time.Second)) {
		t.Fatalf("after 5 in a row: ejected %v until %v, %d ejections; want ejected until %v, 1", st.Ejected, st.EjectedUntil, st.Ejections, ejectedAt.Add(30*time.Second))
	}
	if got := countPicks(t, b, 20, now); got["b"] != 20 {
		t.Errorf("a ejected: picks %v, want all on b", got)
	}
	if got := countPicks(t, b, 20, ejectedAt.Add(30*time.Second-time.Nanosecond)); got["b"] != 20 {
		t.Errorf("just before the end of the ejection: picks %v, want all on b", got)
	}
	b.Report("b", true, now)
	if _, err := b.PickAction(now, 0, nil, &Tried{st: [MaxTried]*targetState{b.states["b"]}, n: 1}); err == nil || !strings.Contains(err.Error(), "a (ejected") {
		t.Errorf("refusal while a is ejected: %v, want it to name a as ejected", err)
	}
	// Back after the duration, with its share.
	back := ejectedAt.Add(30 * time.Second)
	if got := countPicks(t, b, 20, back); got["a"] != 10 {
		t.Errorf("after the ejection: picks %v, want 10 each", got)
	}
	if st := b.Snapshot(back).Targets[0]; st.Ejected || st.Ejections != 1 || st.Consecutive != 0 {
		t.Errorf("after the ejection: ejected %v, %d ejections, run %d; want back, 1, 0", st.Ejected, st.Ejections, st.Consecutive)
	}
	ev := rec.events()
	if len(ev) != 1 || ev[0].Target != "a" || ev[0].Service != "vs" || ev[0].Failures != 5 || ev[0].Ejected != 1 || ev[0].Targets != 2 {
		t.Errorf("ejections heard: %+v, want one of a after 5 failures, 1 of 2 out", ev)
	}
}

func TestEjectionKeepsMaxPercent(t *testing.T) {
	b := mustNew(t, makeVS("a", "b", "c"), ejectionSettings(50, false))
	var rec recorder
	b.OnEject(rec.hear)
	now := t0
	// a and b fail every connect, interleaved, ten times each.
	for range 10 {
		for _, name := range []string{"a", "b"} {
			if !failConnect(t, b, name, now) && b.Snapshot(now).Targets[nameIndex(name)].Ejected == false {
				t.Fatalf("%s neither pickable nor ejected", name)
			}
		}
		now = now.Add(2 * time.Millisecond)
	}
	out := 0
	for _, st := range b.Snapshot(now).Targets {
		if st.Ejected {
			out++
		}
		if st.Ejections > 1 {
			t.Errorf("%s ejected %d times", st.Name, st.Ejections)
		}
	}
	if out != 1 {
		t.Errorf("%d of 3 targets ejected with maxPercent 50, want 1", out)
	}
	if ev := rec.events(); len(ev) != 1 || ev[0].Target != "a" {
		t.Errorf("ejections heard: %+v, want one, of a (the first to fail 5 times)", ev)
	}
	// The one not ejected is still picked: 2 of 3 out would exceed 50 %.
	if got := countPicks(t, b, 30, now); got["b"] == 0 || got["a"] != 0 {
		t.Errorf("picks %v: want b still picked, a not", got)
	}
	// Once a is back, b's next failure (its run is past 5) ejects it.
	now = now.Add(30 * time.Second)
	failConnect(t, b, "b", now)
	if ev := rec.events(); len(ev) != 2 || ev[1].Target != "b" {
		t.Errorf("after a's return: ejections %+v, want b second", ev)
	}
}

func nameIndex(name string) int { return int(name[0] - 'a') }

func TestEjectionByServerErrors(t *testing.T) {
	for _, count := range []bool{false, true} {
		b := mustNew(t, makeVS("a", "b"), ejectionSettings(50, count))
		for range 5 {
			b.ReportStatus("a", 503, t0)
		}
		if got := b.Snapshot(t0).Targets[0].Ejected; got != count {
			t.Errorf("serverErrors %v: 5 responses 503: ejected %v", count, got)
		}
		b = mustNew(t, makeVS("a", "b"), ejectionSettings(50, count))
		for i := range 10 {
			status := 500
			if i%2 == 1 {
				status = 404 // not a failure: resets the run
			}
			b.ReportStatus("a", status, t0)
		}
		if b.Snapshot(t0).Targets[0].Ejected {
			t.Errorf("serverErrors %v: alternating 500 and 404 ejected", count)
		}
	}
	// Off: no counting at all.
	b := mustNew(t, makeVS("a", "b"), policy.BalancerSettings{RetryInterval: time.Millisecond})
	for i := range 20 {
		failConnect(t, b, "a", t0.Add(time.Duration(i)*2*time.Millisecond))
	}
	if st := b.Snapshot(t0.Add(time.Second)).Targets[0]; st.Ejected || st.Consecutive != 0 {
		t.Errorf("ejection off: ejected %v, run %d", st.Ejected, st.Consecutive)
	}
}
