package netstack

// TIME_WAIT reopen
//
// When a target closes first, weir sends the client leg's FIN first and that
// leg waits in TIME_WAIT. A busy client soon reuses the 4-tuple. gVisor
// hands a new SYN that hits a TIME_WAIT endpoint to a *listening* endpoint on
// the same address and port (RFC 1122's "MAY accept a new SYN"), but weir
// has no listener, only a forwarder, so gVisor drops the SYN, and every
// retry of it, until TIME_WAIT ends: the client stalls for its SYN timeouts
// (1 s, 3 s, …) and connections per second collapse.
//
// weir does what Linux does for an acceptable SYN: the TIME_WAIT connection
// gives way. The link's reader shows every pure SYN's 4-tuple (parsed by
// datapath.Parse, see synKey) to onSYN before the stack
// sees it; if its 4-tuple belongs to a client leg weir closed and that leg is
// in TIME_WAIT, the leg is aborted (freeing the 4-tuple; the RST it emits
// carries the old connection's numbers, which the client's new SYN_SENT
// ignores as unacceptable) and the SYN then reaches the forwarder as a new
// connection. Linux also reopens on an old-sequence SYN after one round of
// ACK and RST; weir skips that round: the 4-tuple's old connection is over
// on both sides (the client sent its FIN and weir acknowledged it).

import (
	"encoding/binary"
	"hash/maphash"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/waiter"
)

// twKey is a 4-tuple as weir's side sees it.
type twKey struct {
	local, remote netip.AddrPort
}

// timeWaitTable holds the client legs weir closed first, until they leave
// TIME_WAIT.
type timeWaitTable struct {
	mu       sync.Mutex
	m        map[twKey]*Conn // protected by mu
	reopened atomic.Uint64
	recent   recentTuples // listeners' 4-tuples, for cookie replays
}

func (t *timeWaitTable) init() {
	t.m = make(map[twKey]*Conn)
	t.recent.init()
}

func keyOf(id stack.TransportEndpointID) twKey {
	return twKey{
		local:  netip.AddrPortFrom(netipAddr(id.LocalAddress), id.LocalPort),
		remote: netip.AddrPortFrom(netipAddr(id.RemoteAddress), id.RemotePort),
	}
}

// track records c if weir closed it first (it is in FIN_WAIT or TIME_WAIT
// now) and removes it again once it is closed.
func (t *timeWaitTable) track(c *Conn) {
	switch c.state() {
	case tcp.StateFinWait1, tcp.StateFinWait2, tcp.StateClosing, tcp.StateTimeWait:
	default:
		return
	}
	k := keyOf(c.ep.Info().(*stack.TransportEndpointInfo).ID)
	t.mu.Lock()
	t.m[k] = c
	t.mu.Unlock()
	// The stack notifies EventHUp when TIME_WAIT ends. The callback runs in
	// the notifier's context and must not touch the waiter queue.
	entry := waiter.NewFunctionEntry(waiter.EventHUp, func(waiter.EventMask) {
		switch c.state() {
		case tcp.StateClose, tcp.StateError:
			t.mu.Lock()
			if t.m[k] == c {
				delete(t.m, k)
			}
			t.mu.Unlock()
		}
	})
	c.wq.EventRegister(&entry)
	// It may have closed before the entry was registered.
	switch c.state() {
	case tcp.StateClose, tcp.StateError:
		t.mu.Lock()
		if t.m[k] == c {
			delete(t.m, k)
		}
		t.mu.Unlock()
	}
}

// onSYN runs in a link's reader goroutine for every pure SYN, with its
// 4-tuple k.
func (t *timeWaitTable) onSYN(k twKey) {
	t.recent.forget(k)
	t.mu.Lock()
	c := t.m[k]
	if c == nil {
		t.mu.Unlock()
		return
	}
	if s := c.state(); s != tcp.StateTimeWait {
		if s == tcp.StateClose || s == tcp.StateError {
			delete(t.m, k)
		}
		t.mu.Unlock()
		return
	}
	delete(t.m, k)
	t.mu.Unlock()
	// Abort notifies the waiter queue, whose callback takes t.mu: call it
	// unlocked.
	c.ep.Abort()
	t.reopened.Add(1)
}

// Cookie replays
//
// gVisor's SYN-cookie check (accept.go isCookieValid) reads the cookie as
// ack-1 less a hash of the 4-tuple less seq-1, so it is blind to equal
// advances of a segment's sequence and acknowledgement numbers. A
// connection that came in through a cookie and moved as many bytes each
// way (an echo: "ping" in, "ping" out, a FIN each) still carries a valid
// cookie in every later segment: once weir's end of it is gone, a late
// ACK or a retransmitted FIN of the client's that reaches the listener
// (weir's FIN retransmitted under load and acknowledged twice, the
// client's FIN again after weir's TIME_WAIT) is taken for the last ACK of
// a new handshake, within the cookie's two minutes, and the listener
// accepts a connection no client opened, which weir then admits and dials
// a target for, and which outlives both ends (TestSYNFloodCookies caught
// one in 60 runs beside a load: 41 admitted for 40 clients).
//
// A new connection of a 4-tuple starts with a SYN, so weir remembers the
// 4-tuple of every connection a listener accepted, from its accept until
// recentFor after it ended, and forgets it on a pure SYN of that 4-tuple
// (the link's SYN hook, before the stack sees the SYN). A listener's new
// connection whose 4-tuple is still remembered had no SYN since the last
// one: it is the old connection's late segment, aborted before admission
// and counted (CookieReplays). Entries are keyed by a 64-bit hash of the
// 4-tuple: a collision can only forget a 4-tuple early, and an abort needs
// a remembered hash with no SYN of the aborted 4-tuple since.

const (
	// recentFor is how long a 4-tuple is remembered after its connection
	// ended: a client's late segments come within its retransmissions
	// (a Linux client's TIME_WAIT is 60 s).
	recentFor = 60 * time.Second
	// recentMax bounds the ended 4-tuples remembered (about 48 B each):
	// past it the oldest are forgotten first.
	recentMax = 1 << 16
)

// recentEntry is a remembered 4-tuple: the connection that holds it and,
// once it ended, until when (zero: still open).
type recentEntry struct {
	gen   uint64
	until int64 // nanoseconds on recentTuples' clock
}

// endedEntry is one ended connection in recentTuples' expiry queue.
type endedEntry struct {
	k     uint64
	gen   uint64
	until int64
}

// recentTuples remembers the 4-tuples of the connections VIP listeners
// accepted (see Cookie replays). Safe for concurrent use.
type recentTuples struct {
	seed    maphash.Seed
	base    time.Time
	replays atomic.Uint64

	mu    sync.Mutex
	m     map[uint64]recentEntry // protected by mu
	queue []endedEntry           // protected by mu: in order of until, from head
	head  int                    // protected by mu
	peak  int                    // protected by mu: len(m)'s high-water mark since m was made
	gen   uint64                 // protected by mu
	timer *time.Timer            // protected by mu: expires ended entries; nil when none is armed
	done  bool                   // protected by mu: stopped, no timer any more
	// forTest, when set, replaces recentFor.
	forTest time.Duration
}

func (r *recentTuples) init() {
	r.seed = maphash.MakeSeed()
	r.base = time.Now()
	r.m = make(map[uint64]recentEntry)
}

func (r *recentTuples) hash(k twKey) uint64 {
	var b [2 * (16 + 2)]byte
	la, ra := k.local.Addr().As16(), k.remote.Addr().As16()
	copy(b[0:16], la[:])
	copy(b[18:34], ra[:])
	binary.BigEndian.PutUint16(b[16:], k.local.Port())
	binary.BigEndian.PutUint16(b[34:], k.remote.Port())
	return maphash.Bytes(r.seed, b[:])
}

func (r *recentTuples) now() int64 { return int64(time.Since(r.base)) }

// accept is called for each connection a listener accepted, before it is
// served. replay reports a 4-tuple still remembered (a cookie replay: abort
// it); otherwise the 4-tuple is remembered from now, for the connection
// gen, until ended(k, gen) plus recentFor.
func (r *recentTuples) accept(k twKey) (gen uint64, replay bool) {
	h := r.hash(k)
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.m[h]; ok {
		return 0, true
	}
	r.gen++
	r.m[h] = recentEntry{gen: r.gen}
	r.peak = max(r.peak, len(r.m))
	return r.gen, false
}

// ended starts the recentFor of connection gen's 4-tuple.
func (r *recentTuples) ended(k twKey, gen uint64) {
	h := r.hash(k)
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.m[h]
	if !ok || e.gen != gen || e.until != 0 {
		return
	}
	hold := recentFor
	if r.forTest > 0 {
		hold = r.forTest
	}
	e.until = r.now() + int64(hold)
	r.m[h] = e
	r.queue = append(r.queue, endedEntry{k: h, gen: gen, until: e.until})
	r.expireLocked(r.now())
	if r.timer == nil && !r.done && r.head < len(r.queue) {
		r.timer = time.AfterFunc(time.Duration(r.queue[r.head].until-r.now()), r.expire)
	}
}

// forget drops k: a pure SYN of k arrived, a new connection starts.
func (r *recentTuples) forget(k twKey) {
	h := r.hash(k)
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.m[h]; ok {
		delete(r.m, h)
		r.shrinkLocked()
	}
}

// expire runs on the timer: it forgets what is due and re-arms for the
// next.
func (r *recentTuples) expire() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.timer = nil
	now := r.now()
	r.expireLocked(now)
	if !r.done && r.head < len(r.queue) {
		r.timer = time.AfterFunc(time.Duration(r.queue[r.head].until-now), r.expire)
	}
}

// expireLocked forgets the ended 4-tuples past their time, and the oldest
// past recentMax.
func (r *recentTuples) expireLocked(now int64) {
	for r.head < len(r.queue) && (r.queue[r.head].until <= now || len(r.queue)-r.head > recentMax) {
		x := r.queue[r.head]
		r.queue[r.head] = endedEntry{}
		r.head++
		if e, ok := r.m[x.k]; ok && e.gen == x.gen && e.until == x.until {
			delete(r.m, x.k)
		}
	}
	switch {
	case r.head == len(r.queue):
		// Empty: give the queue's memory back (a burst's worth).
		r.queue, r.head = nil, 0
	case r.head > len(r.queue)/2 && r.head > 1024:
		r.queue = append([]endedEntry(nil), r.queue[r.head:]...)
		r.head = 0
	}
	r.shrinkLocked()
}

// shrinkLocked remakes the map once it holds an eighth of its peak: a Go
// map keeps its buckets when emptied, and 20 000 connections' worth would
// stay allocated after they are long gone.
func (r *recentTuples) shrinkLocked() {
	if r.peak < 4096 || len(r.m) > r.peak/8 {
		return
	}
	m := make(map[uint64]recentEntry, len(r.m))
	for k, v := range r.m {
		m[k] = v
	}
	r.m, r.peak = m, len(m)
}

// size returns the number of 4-tuples remembered, for tests.
func (r *recentTuples) size() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.m)
}

// stop disarms the expiry timer (the forwarder closed).
func (r *recentTuples) stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.done = true
	if r.timer != nil {
		r.timer.Stop()
		r.timer = nil
	}
}
