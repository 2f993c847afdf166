package balancer

import (
	"time"
)

// Outlier ejection (policy.Ejection, balancer.ejection): every connection or
// request reports whether its target failed it (Lease.Failed for a failed
// connect or a first-byte timeout, Report for the rest); ConsecutiveFailures
// failures in a row eject the target for For, unless that would put more
// than MaxPercent of the service's targets out at once. A success resets the
// run. An ejected target is down to the picks (Why Ejected) and comes back
// by itself when For has passed, ramped by slow start if configured.

// Ejection is one ejection, as OnEject hears it.
type Ejection struct {
	Service  string
	Target   string
	Failures int       // the failures in a row that ejected it
	Until    time.Time // when it comes back
	Ejected  int       // targets of the service ejected now, this one included
	Targets  int       // targets of the service
}

// OnEject sets f to hear each ejection once, from the goroutine that
// reported the failure that ejected the target; f must not block. nil stops
// it.
func (b *Balancer) OnEject(f func(Ejection)) {
	if f == nil {
		b.onEject.Store(nil)
		return
	}
	b.onEject.Store(&f)
}

// Report counts one connection's or request's outcome at target for
// outlier ejection: ok false is a failure, ok true resets the target's run
// of failures. A failed connect reports through Lease.Failed instead. It
// returns whether this report ejected the target. Unknown names and
// ejection off (the zero policy.Ejection) do nothing.
func (b *Balancer) Report(target string, ok bool, now time.Time) (ejected bool) {
	t := b.tab.Load()
	if t.settings.Ejection.ConsecutiveFailures <= 0 {
		return false // off: every connection's end costs nothing
	}
	for i := range t.entries {
		if e := &t.entries[i]; e.t.Name == target {
			return b.observe(e.st, ok, now)
		}
	}
	return false
}

// ReportStatus is Report for an http response: a 5xx status is a failure
// when ejection counts server errors (policy.Ejection.ServerErrors), any
// other status a success.
func (b *Balancer) ReportStatus(target string, status int, now time.Time) (ejected bool) {
	bad := status >= 500 && status <= 599 && b.tab.Load().settings.Ejection.ServerErrors
	return b.Report(target, !bad, now)
}

// observe counts one outcome of st and ejects it when its run of failures
// reaches the threshold and the service's ejected share allows.
func (b *Balancer) observe(st *targetState, ok bool, now time.Time) bool {
	t := b.tab.Load()
	ej := t.settings.Ejection
	if ej.ConsecutiveFailures <= 0 {
		return false
	}
	if ok {
		if st.consecutive.Load() != 0 {
			st.consecutive.Store(0)
		}
		return false
	}
	n := st.consecutive.Add(1)
	if n < int64(ej.ConsecutiveFailures) {
		return false
	}
	ns := now.UnixNano()
	b.mu.Lock()
	t = b.tab.Load()
	if ns < st.ejectedUntil.Load() {
		b.mu.Unlock()
		return false // ejected already
	}
	out, mine := 0, false
	for i := range t.entries {
		s := t.entries[i].st
		if ns < s.ejectedUntil.Load() {
			out++
		}
		mine = mine || s == st
	}
	total := len(t.entries)
	// Never more than MaxPercent of the targets out: (out+1)/total ≤ max%.
	if !mine || (out+1)*100 > total*ej.MaxPercent {
		b.mu.Unlock()
		return false
	}
	until := ns + int64(ej.For)
	st.ejectedUntil.Store(until)
	if until > st.upSince.Load() {
		st.upSince.Store(until) // slow start ramps it from its return
	}
	st.ejections.Add(1)
	st.consecutive.Store(0)
	ev := Ejection{Service: t.vs.Name, Target: st.name, Failures: int(n), Until: time.Unix(0, until).In(now.Location()),
		Ejected: out + 1, Targets: total}
	b.mu.Unlock()
	if f := b.onEject.Load(); f != nil {
		(*f)(ev)
	}
	return true
}
