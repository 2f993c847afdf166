package proxy

// Warm goroutines
//
// Every proxied connection runs on three goroutines (serve, then one per
// splice half), and each used to be new: it started on a small stack and
// grew it, copying, as the connection went deep into gVisor's send path
// and the host dialer (runtime.newstack was 6 % of weir's CPU at 3 000
// connections/s). A WarmPool keeps up to maxIdle finished goroutines
// parked on a channel, grown stacks and all, for the next connection's
// function. The garbage collector halves an idle goroutine's stack at most
// once per cycle, so under load the parked ones stay warm; when the load
// stops they shrink back.

import (
	"sync"
	"sync/atomic"
)

// WarmPool runs functions on reused goroutines. Make one with NewWarmPool.
type WarmPool struct {
	work    chan func() // unbuffered: a send succeeds only to a parked worker
	quit    chan struct{}
	maxIdle int
	mu      sync.Mutex // protects idle and closed
	idle    int
	closed  bool
	wg      sync.WaitGroup // every worker, parked or running
	spawned atomic.Int64   // goroutines started, for tests
}

// DefaultWarmIdle bounds the parked goroutines: up to three per
// connection in setup for a few dozen concurrent new connections. A parked
// one costs its (shrinking) stack.
const DefaultWarmIdle = 64

// NewWarmPool returns a pool that keeps at most maxIdle goroutines parked.
func NewWarmPool(maxIdle int) *WarmPool {
	return &WarmPool{work: make(chan func()), quit: make(chan struct{}), maxIdle: maxIdle}
}

// Idle returns how many goroutines are parked now.
func (p *WarmPool) Idle() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.idle
}

// Go runs fn on a parked goroutine if one is waiting, or on a new one.
// After close it still runs fn, on a new goroutine that is not kept.
func (p *WarmPool) Go(fn func()) {
	select {
	case p.work <- fn:
		return
	default:
	}
	p.wg.Add(1)
	p.spawned.Add(1)
	go p.workLoop(fn)
}

// workLoop runs in its own goroutine: fn, then whatever Go hands it while
// it is parked, until the pool has maxIdle parked already or is closed.
func (p *WarmPool) workLoop(fn func()) {
	defer p.wg.Done()
	for {
		fn()
		p.mu.Lock()
		if p.closed || p.idle >= p.maxIdle {
			p.mu.Unlock()
			return
		}
		p.idle++
		p.mu.Unlock()
		select {
		case fn = <-p.work:
			p.mu.Lock()
			p.idle--
			p.mu.Unlock()
		case <-p.quit:
			return
		}
	}
}

// Close ends the parked goroutines and waits for every worker (running
// ones finish their function first). It is safe to call more than once.
func (p *WarmPool) Close() {
	p.mu.Lock()
	if !p.closed {
		p.closed = true
		close(p.quit)
	}
	p.mu.Unlock()
	p.wg.Wait()
}
