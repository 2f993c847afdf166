package balancer

import (
	"context"
	"net"
	"sync"
	"time"
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

// Checker runs active TCP health checks for one Balancer: every
// Health.Interval of the balancer's current settings it connects to each
// target's address with Health.Timeout and reports the result. A check passes
// when the TCP handshake completes.
type Checker struct {
	// Balancer is the balancer whose targets are checked.
	Balancer *Balancer
	// Dial connects to a target; nil uses a net.Dialer. The context carries
	// the check's timeout.
	Dial func(ctx context.Context, network, address string) (net.Conn, error)
	// Parallel bounds the checks in flight at once; 0 means 32.
	Parallel int
	// Now returns the time results are reported at; nil means time.Now.
	Now func() time.Time
}

// idleRecheck is how often a Checker whose balancer has checks turned off
// (Interval 0) looks again, so that a reload turning them on takes effect.
const idleRecheck = time.Second

// Loop runs the checks until ctx is done; it runs in its own goroutine
// (`go c.Loop(ctx)`) and returns ctx.Err() only after every check it started
// has finished, so it leaks no goroutine. Each round checks every target of
// the table current at its start.
func (c *Checker) Loop(ctx context.Context) error {
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-timer.C:
		}
		t := c.Balancer.tab.Load()
		hc := t.settings.Health
		if hc.Interval <= 0 {
			timer.Reset(idleRecheck)
			continue
		}
		c.round(ctx, t)
		timer.Reset(hc.Interval)
	}
}

// CheckOnce runs one round of checks over the current targets and returns
// when they have all been reported (or ctx is done). With health checks off
// (no Health.Interval) it checks nothing: no later round would undo its
// results.
func (c *Checker) CheckOnce(ctx context.Context) {
	c.round(ctx, c.Balancer.tab.Load())
}

func (c *Checker) round(ctx context.Context, t *table) {
	if t.settings.Health.Interval <= 0 {
		return
	}
	timeout := t.settings.Health.Timeout // policy.Compile's: Interval/2 unless set
	dial := c.Dial
	if dial == nil {
		var d net.Dialer
		dial = d.DialContext
	}
	now := c.Now
	if now == nil {
		now = time.Now
	}
	par := c.Parallel
	if par <= 0 {
		par = 32
	}
	sem := make(chan struct{}, par)
	var wg sync.WaitGroup
	for i := range t.entries {
		e := &t.entries[i]
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			wg.Wait()
			return
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			ok := false
			if e.t.Addr.IsValid() {
				cctx, cancel := context.WithTimeout(ctx, timeout)
				// A target that keeps the client's port is checked on
				// the service's first port.
				conn, err := dial(cctx, "tcp", e.t.DialAddr(t.vs.Ports.Lo).String())
				cancel()
				if err == nil {
					ok = true
					conn.Close()
				}
			}
			if ctx.Err() != nil {
				return // cancelled, not a verdict on the target
			}
			t.reportHealth(e.st, ok, now())
		}()
	}
	wg.Wait()
}
