package proxy

import (
	"sync"
	"testing"
	"time"

	"weir/internal/testutil"
)

// TestWarmPool: sequential work reuses one goroutine; concurrent work gets
// new ones, of which at most maxIdle stay parked; close ends them all and
// Go still runs functions after it.
func TestWarmPool(t *testing.T) {
	p := NewWarmPool(4)
	for range 100 {
		done := make(chan struct{})
		p.Go(func() { close(done) })
		<-done
		// The worker parks after fn returns: wait for it before the next
		// Go. (It counts itself idle just before it waits on the channel,
		// so a Go in between starts a second one now and then.)
		testutil.Eventually(t, 5*time.Second, func() bool { return p.Idle() >= 1 }, "the worker parks")
	}
	if n := p.spawned.Load(); n > 10 {
		t.Errorf("100 sequential functions spawned %d goroutines, want them reused", n)
	}
	// 10 at once: 9 more goroutines; 4 stay parked.
	release := make(chan struct{})
	var wg sync.WaitGroup
	for range 10 {
		wg.Add(1)
		p.Go(func() { defer wg.Done(); <-release })
	}
	close(release)
	wg.Wait()
	testutil.Eventually(t, 5*time.Second, func() bool { return p.Idle() == 4 }, "4 parked after the burst")
	if n := p.spawned.Load(); n < 10 {
		t.Errorf("10 concurrent functions on %d goroutines in all", n)
	}
	p.Close()
	ran := make(chan struct{})
	p.Go(func() { close(ran) })
	select {
	case <-ran:
	case <-time.After(5 * time.Second):
		t.Fatal("Go after close did not run its function")
	}
	p.Close()
}
