package policy

import (
	"context"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// A queue at the limit (HAProxy's queue at a server's maxconn, answered 503
// after `timeout queue`; Envoy's max_pending_requests).
//
// A level (or a client, see clients.go) whose enforced maxConnections is
// set with Limits.Queue > 0 lets up to Queue connections (tcp) or requests
// (http) wait for a slot instead of being refused at once:
//
//	Wait ──► Admit ─ ok ─────────────────────────────► admitted (waited 0)
//	           └ refused at a level with a queue ─► join its queue (full: refused at once)
//	                ├ a slot freed (Release at that level wakes the head) ─► head admits
//	                ├ refused at another level with a queue ─► moves to that queue
//	                └ QueueTimeout passed, or ctx done ─► refused: the limit, "waited …"
//
// First in, first out: a level whose queue is not empty refuses every
// connection that is not the queue's head, so a slot freed goes to the
// head, not to a new arrival, which joins the tail. Waiting is in the
// caller's goroutine (the connection's: its handshake is complete, the wait
// is inside the connection); nothing is held while it waits but its place.

// DefaultQueueTimeout is Limits.QueueTimeout when a queue is set without
// one.
const DefaultQueueTimeout = 2 * time.Second

// waitQueue is one level's (or client's) queue of connections waiting for
// a slot.
type waitQueue struct {
	n    atomic.Int64 // waiters now: read lock-free by Admit
	mu   sync.Mutex
	head *waiter // by mu
	tail *waiter // by mu
	c    *queueCounters
}

// queueCounters are the counters of one level's queue, or of all the
// client queues of one client table.
type queueCounters struct {
	waiting  atomic.Int64
	waits    atomic.Uint64
	timeouts atomic.Uint64
	full     atomic.Uint64
	waitedNs atomic.Int64 // total time waited by those that left
	served   atomic.Uint64
}

// waiter is one connection in a queue.
type waiter struct {
	next *waiter
	prev *waiter
	q    *waitQueue
	wake chan struct{} // 1-buffered
}

// join appends w to q, unless q already holds max waiters.
func (q *waitQueue) join(w *waiter, max int64) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.n.Load() >= max {
		q.c.full.Add(1)
		return false
	}
	w.q, w.next, w.prev = q, nil, q.tail
	if q.tail != nil {
		q.tail.next = w
	} else {
		q.head = w
	}
	q.tail = w
	q.n.Add(1)
	q.c.waiting.Add(1)
	q.c.waits.Add(1)
	return true
}

// isHead reports whether w is q's first waiter.
func (q *waitQueue) isHead(w *waiter) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.head == w
}

// leave removes w from q and wakes the next head, which may find a slot
// free (two slots freed while w held the head wake it once).
func (q *waitQueue) leave(w *waiter, waited time.Duration, admitted bool) {
	q.mu.Lock()
	if w.prev != nil {
		w.prev.next = w.next
	} else {
		q.head = w.next
	}
	if w.next != nil {
		w.next.prev = w.prev
	} else {
		q.tail = w.prev
	}
	w.next, w.prev, w.q = nil, nil, nil
	q.n.Add(-1)
	q.c.waiting.Add(-1)
	h := q.head
	q.mu.Unlock()
	q.c.waitedNs.Add(int64(waited))
	if admitted {
		q.c.served.Add(1)
	}
	if h != nil {
		signal(h.wake)
	}
}

// wakeHead tells q's first waiter that a slot may be free. Release calls
// it at every level it uncounts whose queue is not empty.
func (q *waitQueue) wakeHead() {
	if q.n.Load() == 0 {
		return
	}
	q.mu.Lock()
	h := q.head
	q.mu.Unlock()
	if h != nil {
		signal(h.wake)
	}
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// QueueStat is one queue's counters.
type QueueStat struct {
	// Limit is the queue's length bound and Timeout its wait bound, as
	// configured; 0: no queue.
	Limit   int64
	Timeout time.Duration
	// Waiting is the connections (requests) waiting now.
	Waiting int64
	// Waits counts those that joined the queue, Served those that left it
	// admitted, TimedOut those refused when QueueTimeout passed, Full the
	// arrivals refused at once because the queue was full.
	Waits, Served, TimedOut, Full uint64
	// Waited is the time spent waiting by all that left the queue.
	Waited time.Duration
}

func (c *queueCounters) stat(lim Limits) QueueStat {
	s := QueueStat{
		Waiting: c.waiting.Load(), Waits: c.waits.Load(), Served: c.served.Load(),
		TimedOut: c.timeouts.Load(), Full: c.full.Load(), Waited: time.Duration(c.waitedNs.Load()),
	}
	if lim.queued() {
		s.Limit, s.Timeout = lim.Queue, lim.queueTimeout()
	}
	return s
}

// queued reports whether lim queues at its connection limit.
func (l Limits) queued() bool {
	return l.Queue > 0 && l.MaxConnections > 0 && l.EnforceConnections
}

func (l Limits) queueTimeout() time.Duration {
	if l.QueueTimeout > 0 {
		return l.QueueTimeout
	}
	return DefaultQueueTimeout
}

// Timer is the clock a wait uses: After returns a channel that fires once
// after d and a stop function. nil in WaitOptions means the real clock.
type Timer func(d time.Duration) (<-chan time.Time, func() bool)

func realTimer(d time.Duration) (<-chan time.Time, func() bool) {
	t := time.NewTimer(d)
	return t.C, t.Stop
}

// WaitOptions are Wait's inputs besides the virtual server and ticket.
type WaitOptions struct {
	// Client is the connection's client address, for the per-client
	// limits (ClientLimits): the carried address when a PROXY header gave
	// one. The zero Addr skips them.
	Client netip.Addr
	// Timer is the clock of the wait; nil: the real one.
	Timer Timer
	// Now is the clock the wait is measured on; nil: time.Now.
	Now func() time.Time
	// Retry, when set, is called when a refusal is this instance's full
	// share of a cluster-wide limit (Refusal.Shared); true means the share
	// grew and Admit runs again at once. It may block (a borrow). While
	// the connection waits in a queue at a shared level it is asked again
	// at each ShareRetry.
	Retry func(ctx context.Context, r Refusal) bool
	// ShareRetry is how often a connection queued at a shared level asks
	// Retry again: other instances' releases do not wake it. Zero: 100 ms.
	ShareRetry time.Duration
}

// Waited says how a Wait went: how long the connection queued, at which
// level, and whether the queue's timeout refused it.
type Waited struct {
	Duration time.Duration
	Queued   bool
	TimedOut bool
	Full     bool
}

// Wait is Admit with the queues: a connection refused by an enforced
// maxConnections whose level (or client) has a queue waits in it, first in
// first out, until a slot is its or the queue's timeout passes (or ctx is
// done); a connection that finds the queue full is refused at once. A
// refusal by anything else (bandwidth, a level without a queue) is
// immediate, as Admit's. A timed-out refusal's Error says how long it
// waited. It allocates only when it waits.
func (a *Admission) Wait(ctx context.Context, vs *VirtualServer, t *Ticket, o WaitOptions) (Refusal, Waited, bool) {
	ref, ok := a.admitClient(vs, o.Client, t, nil)
	if ok {
		return ref, Waited{}, true
	}
	if ref.Shared && o.Retry != nil {
		for i := 0; i < 8 && !ok && ref.Shared && o.Retry(ctx, ref); i++ {
			ref, ok = a.admitClient(vs, o.Client, t, nil)
		}
		if ok {
			return ref, Waited{}, true
		}
	}
	if ref.q == nil {
		return ref, Waited{}, false
	}
	timer, now := o.Timer, o.Now
	if timer == nil {
		timer = realTimer
	}
	if now == nil {
		now = time.Now
	}
	shareRetry := o.ShareRetry
	if shareRetry <= 0 {
		shareRetry = 100 * time.Millisecond
	}
	w := &waiter{wake: make(chan struct{}, 1)}
	start := now()
	var in *waitQueue // the queue w is in
	var fire <-chan time.Time
	var stop func() bool
	defer func() {
		if stop != nil {
			stop()
		}
	}()
	for {
		if ref.q != in {
			if in != nil {
				in.leave(w, now().Sub(start), false)
				in = nil
			}
			if !ref.q.join(w, ref.qmax) {
				ref.qfull = true
				return ref, Waited{Duration: now().Sub(start), Queued: in != nil, Full: true}, false
			}
			in = ref.q
			if stop != nil {
				stop()
			}
			fire, stop = timer(ref.qtimeout)
		}
		// The head tries at once after it joins (a slot freed between its
		// refusal and its joining woke nobody) and on every wake.
		if in.isHead(w) {
			var r2 Refusal
			r2, ok = a.admitClient(vs, o.Client, t, in)
			if !ok && r2.Shared && o.Retry != nil && o.Retry(ctx, r2) {
				r2, ok = a.admitClient(vs, o.Client, t, in)
			}
			if ok {
				d := now().Sub(start)
				in.leave(w, d, true)
				return Refusal{}, Waited{Duration: d, Queued: true}, true
			}
			if r2.q == nil {
				// Refused by a limit without a queue (bandwidth): at once.
				d := now().Sub(start)
				in.leave(w, d, false)
				return r2, Waited{Duration: d, Queued: true}, false
			}
			if r2.q != in {
				ref = r2
				continue // moves to that level's queue
			}
			ref = r2
		}
		var poll <-chan time.Time
		var pstop func() bool
		if ref.Shared && o.Retry != nil {
			poll, pstop = timer(shareRetry)
		}
		select {
		case <-w.wake:
		case <-poll:
		case <-fire:
			if pstop != nil {
				pstop()
			}
			d := now().Sub(start)
			in.c.timeouts.Add(1)
			in.leave(w, d, false)
			ref.waited = ref.qtimeout // the text names the bound that refused
			return ref, Waited{Duration: d, Queued: true, TimedOut: true}, false
		case <-ctx.Done():
			if pstop != nil {
				pstop()
			}
			d := now().Sub(start)
			in.leave(w, d, false)
			ref.waited = d
			return ref, Waited{Duration: d, Queued: true}, false
		}
		if pstop != nil {
			pstop()
		}
	}
}

// appendQueue adds a refusal's queue to its text: how long it waited, or
// that the queue was full.
func (r Refusal) appendQueue(b []byte) []byte {
	switch {
	case r.qfull:
		b = append(b, "; queue full ("...)
		b = strconv.AppendInt(b, r.qmax, 10)
		b = append(b, " waiting)"...)
	case r.waited > 0:
		b = append(b, "; waited "...)
		b = append(b, r.waited.Round(time.Millisecond).String()...)
		b = append(b, " in the queue"...)
	}
	return b
}

// check reports a queue that cannot work: negative, or without an
// enforced maxConnections to wait at.
func (l Limits) check(bad func(string, ...any), where string) {
	if l.Queue < 0 || l.QueueTimeout < 0 {
		bad("%s: queue %d and queueTimeout %v may not be negative", where, l.Queue, l.QueueTimeout)
	}
	if l.Queue > 0 && (l.MaxConnections <= 0 || !l.EnforceConnections) {
		bad("%s: queue %d needs an enforced maxConnections (enforceConnections: true) to wait at", where, l.Queue)
	}
	if l.Queue > MaxQueue {
		bad("%s: queue %d is over %d", where, l.Queue, MaxQueue)
	}
}

// MaxQueue bounds Limits.Queue.
const MaxQueue = 1 << 20
