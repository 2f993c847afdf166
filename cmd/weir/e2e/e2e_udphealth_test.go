//go:build linux

package e2e

// End-to-end test of the udp health check (issue 28): dnsmasq targets
// checked by DNS queries, through host sockets and through the back arm.

import (
	"os"
	"syscall"
	"testing"
	"time"

	"weir/cmd/weir/api"
	"weir/internal/netns"
)

// TestE2EUDPHealthCheck: a udp service's DNS health check, once with host
// sockets and once through the back arm. Of two dnsmasq targets, b is
// stopped (SIGSTOP: its socket stays open, the probes go unanswered): the
// check marks it down within (fall+1) × (interval + timeout) (weir_target_up
// 0, /status health_up false, reason timeout) and every query then goes
// to a, none lost; continued (SIGCONT), it is back after rise passes and
// gets its share again. Then b is killed (its port closed: ICMP port
// unreachable, refused): down again, queries all to a; a new dnsmasq on
// its address brings it back. The times are logged.
func TestE2EUDPHealthCheck(t *testing.T) {
	const (
		interval, timeout = 250 * time.Millisecond, 200 * time.Millisecond
		rise, fall        = 2, 3
		// A round ends when its slowest check does and the next starts
		// interval later: with b silent a round takes interval + timeout.
		// One round more for the one the change fell in, and slack for
		// what a loaded 2-core machine adds.
		round    = interval + timeout
		slack    = time.Second
		downTime = (fall+1)*round + slack
		upTime   = (rise+1)*round + slack
	)
	w := startWeir(t, "udp-health.yaml")
	tns := w.targetNS()
	for _, tc := range []struct {
		service, vip string
		ns           *netns.NS
		addrA, addrB string
	}{
		{"dns-host", "198.18.0.56:53", w.ns, "198.18.1.1", "198.18.1.2"},
		{"dns-netstack", "198.18.0.57:53", tns, "198.18.3.1", "198.18.3.2"},
	} {
		t.Run(tc.service, func(t *testing.T) {
			w.dnsmasqIn(tc.ns, "198.18.9.1", tc.addrA)
			b := w.dnsmasqIn(tc.ns, "198.18.9.2", tc.addrB)
			target := func(st api.Status, name string) api.Target {
				if s := statusService(st, tc.service); s != nil {
					for _, tg := range s.Targets {
						if tg.Name == name {
							return tg
						}
					}
				}
				t.Fatalf("no target %s of %s in /status", name, tc.service)
				return api.Target{}
			}
			passing := func(st api.Status, name string) bool {
				tg := target(st, name)
				return tg.HealthUp && tg.Check != nil && tg.Check.OK
			}
			// The targets may have failed checks before dnsmasq ran.
			w.waitStatus(10*time.Second, "both targets passing their checks", func(st api.Status) bool {
				return passing(st, "a") && passing(st, "b")
			})
			// queries sends 40 queries through the VIP, each a session of
			// its own, and returns how many of them b was given.
			queries := func(what string) uint64 {
				t.Helper()
				_, before := pickedSum(w.status(), tc.service)
				if ok, _ := w.dnsBurst(tc.vip, 40, 4); ok != 40 {
					t.Errorf("%s: %d of 40 queries answered", what, ok)
				}
				_, after := pickedSum(w.status(), tc.service)
				return after["b"] - before["b"]
			}
			if n := queries("both up"); n == 0 || n == 40 {
				t.Errorf("both up: b was given %d of 40 sessions", n)
			}
			// markedDown waits for the check to take b out and returns how
			// long it took from since.
			markedDown := func(what string, since time.Time) (time.Duration, string) {
				t.Helper()
				st := w.waitStatus(10*time.Second, "b marked down ("+what+")", func(st api.Status) bool { return !target(st, "b").HealthUp })
				took := time.Since(since)
				c := target(st, "b").Check
				if c == nil || c.OK {
					t.Fatalf("%s: b down with its last check %+v", what, c)
				}
				if took > downTime {
					t.Errorf("%s: b marked down %v after, want within %v", what, took, downTime)
				}
				fams := w.metrics()
				if up := metricSum(fams, "weir_target_up", map[string]string{"service": tc.service, "target": "b"}); up != 0 {
					t.Errorf("%s: weir_target_up of b %v, want 0", what, up)
				}
				if up := metricSum(fams, "weir_target_up", map[string]string{"service": tc.service, "target": "a"}); up != 1 {
					t.Errorf("%s: weir_target_up of a %v, want 1", what, up)
				}
				if n := queries(what); n != 0 {
					t.Errorf("%s: b, marked down, was given %d sessions", what, n)
				}
				return took, c.Reason
			}
			markedUp := func(what string, since time.Time) time.Duration {
				t.Helper()
				w.waitStatus(10*time.Second, "b back up ("+what+")", func(st api.Status) bool { return passing(st, "b") })
				took := time.Since(since)
				if took > upTime {
					t.Errorf("%s: b back up %v after, want within %v", what, took, upTime)
				}
				if n := queries(what); n == 0 {
					t.Errorf("%s: b, back up, was given none of 40 sessions", what)
				}
				return took
			}

			if err := b.Signal(syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			down, reason := markedDown("stopped", time.Now())
			if reason != "timeout" {
				t.Errorf("stopped: b's reason %q, want timeout", reason)
			}
			if err := b.Signal(syscall.SIGCONT); err != nil {
				t.Fatal(err)
			}
			up := markedUp("continued", time.Now())
			t.Logf("%s: b stopped (no answer): down after %v, reason %s; continued: up after %v (interval %v, timeout %v, fall %d, rise %d)",
				tc.service, down.Round(time.Millisecond), reason, up.Round(time.Millisecond), interval, timeout, fall, rise)

			if err := b.Kill(); err != nil {
				t.Fatal(err)
			}
			waitExit(b)
			down, reason = markedDown("killed", time.Now())
			// Host sockets on loopback see every ICMP port unreachable;
			// the back arm's come from the target namespace, where the
			// kernel rate-limits them, so a probe may time out instead.
			if reason != "refused" && (tc.ns == w.ns || reason != "timeout") {
				t.Errorf("killed: b's reason %q, want refused", reason)
			}
			w.dnsmasqIn(tc.ns, "198.18.9.2", tc.addrB)
			up = markedUp("restarted", time.Now())
			t.Logf("%s: b killed (port closed): down after %v, reason %s; restarted: up after %v", tc.service, down.Round(time.Millisecond), reason, up.Round(time.Millisecond))
		})
	}
}

// waitExit waits (up to 5 s) until the killed process p is gone, so that
// its port is closed.
func waitExit(p *os.Process) {
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if p.Signal(syscall.Signal(0)) != nil {
			return
		}
	}
}
