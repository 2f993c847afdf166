package health

import (
	"context"
	"sync"
	"time"
)

// Supervisor runs one Checker per service while the service exists: Start
// starts them, Sync then starts the checkers of new services and stops
// those of services gone (a reload), Close stops them all. A checker idles while its service's plan
// has checks off. The zero value is not usable: Plan and Report are
// required.
type Supervisor struct {
	// Plan returns the round to run for service; it is called at the start
	// of each round, so it sees the config current then.
	Plan func(service string) Plan
	// Report receives each verdict (see Checker.Report).
	Report func(service, target string, r Result, now time.Time)
	// Now is the checkers' clock; nil means time.Now.
	Now func() time.Time

	mu     sync.Mutex
	checks map[string]context.CancelFunc // running checkers by service; nil before Start and after Close
	closed bool
	wg     sync.WaitGroup
}

// Start runs a checker for every service named.
func (s *Supervisor) Start(services []string) {
	s.mu.Lock()
	if !s.closed && s.checks == nil {
		s.checks = map[string]context.CancelFunc{}
	}
	s.mu.Unlock()
	s.Sync(services)
}

// Sync runs a checker for every service named and stops the others'.
// Before Start and after Close it does nothing.
func (s *Supervisor) Sync(services []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.checks == nil {
		return
	}
	keep := make(map[string]bool, len(services))
	for _, name := range services {
		keep[name] = true
	}
	for name, cancel := range s.checks {
		if !keep[name] {
			cancel()
			delete(s.checks, name)
		}
	}
	for _, name := range services {
		if s.checks[name] != nil {
			continue
		}
		ctx, cancel := context.WithCancel(context.Background())
		s.checks[name] = cancel
		c := &Checker{
			Plan:   func() Plan { return s.Plan(name) },
			Report: func(target string, r Result, now time.Time) { s.Report(name, target, r, now) },
			Now:    s.Now,
		}
		s.wg.Go(func() { c.Loop(ctx) })
	}
}

// Close stops every checker and returns once they have all ended.
func (s *Supervisor) Close() {
	s.mu.Lock()
	s.closed = true
	for _, cancel := range s.checks {
		cancel()
	}
	s.checks = nil
	s.mu.Unlock()
	s.wg.Wait()
}
