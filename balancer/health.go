package balancer

import "time"

// Health is the rise/fall state machine of one target's active health checks:
// a target that is up goes down after Fall consecutive failed checks, and a
// target that is down comes up after Rise consecutive good ones. The zero
// value is up, as a target is before its first check. Health is not safe for
// concurrent use; the balancer guards each target's with a mutex.
type Health struct {
	down   bool
	streak int // consecutive results contradicting the current state
}

// Report applies one check result with the given rise and fall counts (values
// below 1 count as 1) and reports whether the state changed.
func (h *Health) Report(ok bool, rise, fall int) (changed bool) {
	if ok != h.down {
		// The result agrees with the state: an up target passed, or a down
		// one failed.
		h.streak = 0
		return false
	}
	h.streak++
	need := max(fall, 1)
	if h.down {
		need = max(rise, 1)
	}
	if h.streak < need {
		return false
	}
	h.down = !h.down
	h.streak = 0
	return true
}

// Up reports whether the checks consider the target up.
func (h *Health) Up() bool { return !h.down }

// ReportHealth applies one active health-check result for the target called
// name at now, with the rise and fall counts of the current settings, and
// returns whether the target is now up by its checks and whether that changed.
// A target that comes up starts slow start at now. Unknown names return
// (false, false).
func (b *Balancer) ReportHealth(name string, ok bool, now time.Time) (up, changed bool) {
	b.mu.Lock()
	st := b.states[name]
	b.mu.Unlock()
	if st == nil {
		return false, false
	}
	return b.tab.Load().reportHealth(st, ok, now)
}

func (t *table) reportHealth(st *targetState, ok bool, now time.Time) (up, changed bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	changed = st.health.Report(ok, t.settings.Health.Rise, t.settings.Health.Fall)
	up = st.health.Up()
	if changed {
		if up {
			st.upSince.Store(now.UnixNano())
		}
		st.healthDown.Store(!up)
	}
	return up, changed
}
