// Package health runs weir's active TCP health checks: the control-plane
// half of health checking. The balancer keeps each target's rise/fall state
// (balancer.Health, Balancer.ReportHealth) and never dials; a Checker dials
// each target the way its connections go (the target's own `via`: a host
// socket or the back arm) and reports each verdict.
//
// A check passes when the TCP handshake completes within the timeout; the
// connection is closed at once.
package health

import (
	"context"
	"net"
	"net/netip"
	"sync"
	"time"

	"weir/policy"
)

// DialFunc connects to addr; the context carries the check's timeout.
type DialFunc func(ctx context.Context, addr netip.AddrPort) (net.Conn, error)

// HostDial dials a kernel TCP socket: how `via: host` targets are checked.
func HostDial(ctx context.Context, addr netip.AddrPort) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, "tcp", addr.String())
}

// Target is one target to check.
type Target struct {
	// Name is what the verdict is reported under (the balancer's target
	// name).
	Name string
	// Addr is the address checked; an invalid Addr fails without a dial.
	Addr netip.AddrPort
	// Dial connects to Addr the way the target's connections go; nil is
	// HostDial.
	Dial DialFunc
}

// Plan is what one round checks: the settings and the targets, both taken
// from the config current when the round starts.
type Plan struct {
	// Settings' Interval is the time between rounds (0: checks off),
	// Timeout each dial's bound (policy.Compile's default: Interval/2).
	// Rise and fall counting is the balancer's.
	Settings policy.HealthCheck
	Targets  []Target
}

// Checker runs rounds of checks. The zero value is not usable: Plan and
// Report are required.
type Checker struct {
	// Plan returns the round to run; it is called at the start of each.
	Plan func() Plan
	// Report receives each verdict, at the time Now returned when the
	// check ended. It is called from the check's goroutine, concurrently
	// with the other checks of the round.
	Report func(name string, ok bool, now time.Time)
	// Parallel bounds the checks in flight at once; 0 means 32.
	Parallel int
	// Now returns the time verdicts are reported at; nil means time.Now.
	Now func() time.Time
}

// IdleRecheck is how often a Checker whose plan has checks turned off
// (Interval 0) looks again, so that a reload turning them on takes effect.
const IdleRecheck = time.Second

// Loop runs rounds until ctx is done; it runs in its own goroutine
// (`go c.Loop(ctx)`) and returns ctx.Err() only after every check it
// started has finished, so it leaks no goroutine.
func (c *Checker) Loop(ctx context.Context) error {
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-timer.C:
		}
		p := c.Plan()
		if p.Settings.Interval <= 0 {
			timer.Reset(IdleRecheck)
			continue
		}
		c.round(ctx, p)
		timer.Reset(p.Settings.Interval)
	}
}

// CheckOnce runs one round and returns when every verdict has been
// reported (or ctx is done). With checks off (no Interval) it checks
// nothing: no later round would undo its verdicts.
func (c *Checker) CheckOnce(ctx context.Context) {
	if p := c.Plan(); p.Settings.Interval > 0 {
		c.round(ctx, p)
	}
}

func (c *Checker) round(ctx context.Context, p Plan) {
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
	defer wg.Wait()
	for _, t := range p.Targets {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return
		}
		wg.Go(func() {
			defer func() { <-sem }()
			ok := check(ctx, t, p.Settings.Timeout)
			if ctx.Err() != nil {
				return // cancelled, not a verdict on the target
			}
			c.Report(t.Name, ok, now())
		})
	}
}

// check dials t once within timeout (0: no bound but ctx's).
func check(ctx context.Context, t Target, timeout time.Duration) bool {
	if !t.Addr.IsValid() {
		return false
	}
	dial := t.Dial
	if dial == nil {
		dial = HostDial
	}
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	conn, err := dial(ctx, t.Addr)
	if err != nil {
		return false
	}
	conn.Close()
	return true
}

// ServiceTargets lists the checks of vs's targets: each at the address a
// client's connection to the service's first port goes to (a target that
// keeps the client's port is checked there), dialed by dial(t.Via).
func ServiceTargets(vs *policy.VirtualServer, dial func(policy.DialVia) DialFunc) []Target {
	out := make([]Target, 0, len(vs.Targets))
	for _, t := range vs.Targets {
		ct := Target{Name: t.Name, Dial: dial(t.Via)}
		if t.Addr.IsValid() {
			ct.Addr = t.DialAddr(vs.Ports.Lo)
		}
		out = append(out, ct)
	}
	return out
}
