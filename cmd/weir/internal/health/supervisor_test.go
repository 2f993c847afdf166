package health

import (
	"sync"
	"testing"
	"time"

	"weir/policy"
)

// TestSupervisorFollowsServices: nothing is checked before Start; Start
// checks every service named; Sync stops the checker of a service gone
// (its plan is asked no more) and starts one for a new service; Close
// stops them all, and a Sync after Close starts nothing (goleak checks no
// checker is left).
func TestSupervisorFollowsServices(t *testing.T) {
	up := listen(t, "127.0.0.1:0")
	var mu sync.Mutex
	asked := map[string]int{}
	reports := make(chan string, 64)
	s := &Supervisor{
		Plan: func(service string) Plan {
			mu.Lock()
			asked[service]++
			mu.Unlock()
			return Plan{Settings: policy.HealthCheck{Interval: time.Millisecond, Timeout: time.Second},
				Targets: []Target{{Name: service + "-t", Addr: up.addr()}}}
		},
		Report: func(service, target string, r Result, _ time.Time) {
			if !r.OK || target != service+"-t" {
				t.Errorf("%s: %s %+v, want %s-t ok", service, target, r, service)
			}
			select {
			case reports <- service:
			default:
			}
		},
	}
	s.Sync([]string{"a"})
	mu.Lock()
	if len(asked) != 0 {
		t.Errorf("Sync before Start asked for plans: %v", asked)
	}
	mu.Unlock()

	waitFor := func(service string) {
		t.Helper()
		for svc := range reports {
			if svc == service {
				return
			}
		}
	}
	s.Start([]string{"a", "b"})
	waitFor("a")
	waitFor("b")

	s.Sync([]string{"b", "c"}) // a gone, c new
	waitFor("c")
	mu.Lock()
	goneAt := asked["a"]
	mu.Unlock()
	// b and c keep running rounds; a, stopped, asks for none.
	for range 5 {
		waitFor("b")
	}
	mu.Lock()
	// A checker stopped just after its timer fired may still ask once.
	if asked["a"] > goneAt+1 {
		t.Errorf("service a asked for %d plans after it was gone", asked["a"]-goneAt)
	}
	mu.Unlock()

	s.Close()
	s.Sync([]string{"d"})
	mu.Lock()
	if asked["d"] != 0 {
		t.Errorf("Sync after Close started a checker")
	}
	mu.Unlock()
}
