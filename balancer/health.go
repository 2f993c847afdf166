package balancer

import (
	"time"

	"weir/policy"
)

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

// Streak is the count of consecutive results contradicting the current
// state: failures toward fall while up, passes toward rise while down.
func (h *Health) Streak() int { return h.streak }

// CheckStatus is a target's last active health check and where its
// rise/fall count stands.
type CheckStatus struct {
	At     time.Time // when the check ended; zero: never checked
	OK     bool
	Reason string // why it failed (refused, timeout, status 503, expect mismatch, ...); empty when OK
	// Streak counts the consecutive results contradicting the current
	// state, toward Need: Fall while the target is up, Rise while down.
	Streak, Need int
}

// healthOf is the health check vs's targets get: the service's own (set by
// policy.Compile) or, for a VirtualServer built without one, s's.
func healthOf(vs *policy.VirtualServer, s policy.BalancerSettings) policy.HealthCheck {
	if vs.Health != nil {
		return *vs.Health
	}
	return s.Health
}

// ReportHealth applies one active health-check result for the target called
// name at now, with the rise and fall counts of the current settings, and
// returns whether the target is now up by its checks and whether that changed.
// A target that comes up starts slow start at now. Unknown names return
// (false, false). It is ReportCheck without a reason.
func (b *Balancer) ReportHealth(name string, ok bool, now time.Time) (up, changed bool) {
	return b.ReportCheck(name, ok, "", now)
}

// ReportCheck is ReportHealth with the failed check's reason, kept with
// the result for Snapshot.
func (b *Balancer) ReportCheck(name string, ok bool, reason string, now time.Time) (up, changed bool) {
	b.mu.Lock()
	st := b.states[name]
	b.mu.Unlock()
	if st == nil {
		return false, false
	}
	return b.tab.Load().reportHealth(st, ok, reason, now)
}

func (t *table) reportHealth(st *targetState, ok bool, reason string, now time.Time) (up, changed bool) {
	h := healthOf(t.vs, t.settings)
	st.mu.Lock()
	defer st.mu.Unlock()
	changed = st.health.Report(ok, h.Rise, h.Fall)
	up = st.health.Up()
	need := max(h.Fall, 1)
	if !up {
		need = max(h.Rise, 1)
	}
	if ok {
		reason = ""
	}
	st.check = CheckStatus{At: now, OK: ok, Reason: reason, Streak: st.health.Streak(), Need: need}
	if changed {
		if up {
			st.upSince.Store(now.UnixNano())
		}
		st.healthDown.Store(!up)
	}
	return up, changed
}

// lastCheck returns st's last check, nil when none was reported.
func (st *targetState) lastCheck() *CheckStatus {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.check.At.IsZero() {
		return nil
	}
	c := st.check
	return &c
}
