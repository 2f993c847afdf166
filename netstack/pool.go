package netstack

// Target connection pool (http virtual servers)
//
//	request routed to a target ──► pool.get: the newest idle connection to
//	    that target (service, target, address) that is still open, else
//	    Forwarder.dial (the same dial path as a spliced connection: host
//	    socket or back arm, so the datapath measures the leg)
//	response complete, both sides agree to keep it ──► pool.put (at most
//	    MaxIdlePerTarget idle per target; older than BackendIdle: closed)
//
// Every target connection, pooled or not, is registered like a spliced
// connection (a connEntry in the forwarder's registry) for as long as it is
// open, so Sample and Conns see its segments, retransmissions, timeouts and
// bytes: the weights of an http service follow the same measurements as
// those of a tcp one. What a target connection does belongs to the request
// in flight on it: lend (pool.get) and park (before pool.put) settle its
// activity with the request that is done and hand it to the next one, its
// action and client (Forwarder.hand); idle in the pool it is its target's
// alone, no service level's, and not an active connection. The entry's
// client leg stays the client connection that opened it.

import (
	"bufio"
	"sync"
	"time"

	"weir/netstack/proxy"
	"weir/policy"
)

// poolKey names the idle connections that may serve a request: the same
// service and target, reached the same way.
type poolKey struct {
	service, target string
	via             policy.DialVia
	addr            string
}

// backendConn is one target connection of an http virtual server.
type backendConn struct {
	key     poolKey
	leg     proxy.Leg
	entry   *connEntry
	br      *bufio.Reader
	bw      *bufio.Writer
	idle    time.Time     // when it was put in the pool
	maxIdle time.Duration // the service's BackendIdle
	uses    int           // requests sent on it
}

// pool holds idle target connections.
type pool struct {
	mu        sync.Mutex
	idle      map[poolKey][]*backendConn // protected by mu; newest last
	closed    bool                       // protected by mu
	lastPrune time.Time                  // protected by mu
}

// get returns an idle connection for k that is still open, or nil. Stale
// ones (idle longer than maxIdle, closed by the target, or with bytes the
// target sent unasked) are closed.
func (p *pool) get(f *Forwarder, k poolKey, maxIdle time.Duration) *backendConn {
	now := time.Now()
	for {
		p.mu.Lock()
		list := p.idle[k]
		if len(list) == 0 {
			p.mu.Unlock()
			return nil
		}
		bc := list[len(list)-1]
		list[len(list)-1] = nil
		p.idle[k] = list[:len(list)-1]
		p.mu.Unlock()
		if now.Sub(bc.idle) < maxIdle && bc.alive() {
			return bc
		}
		f.closeBackend(bc)
	}
}

// alive reports whether an idle connection can carry a request: nothing
// arrived on it (a FIN, a RST or stray bytes all make it unusable). The
// check reads with a deadline already past, so it never blocks.
func (bc *backendConn) alive() bool {
	if bc.br.Buffered() > 0 {
		return false
	}
	if err := bc.leg.SetReadDeadline(time.Unix(1, 0)); err != nil {
		return false
	}
	_, err := bc.br.Peek(1)
	_ = bc.leg.SetReadDeadline(time.Time{})
	return isTimeout(err)
}

// put returns bc to the pool, or closes it when the pool of its target has
// max idle connections already (or the pool is closed).
func (p *pool) put(f *Forwarder, bc *backendConn, max int, maxIdle time.Duration) {
	bc.idle, bc.maxIdle = time.Now(), maxIdle
	p.mu.Lock()
	if bc.idle.Sub(p.lastPrune) >= pruneEvery {
		p.lastPrune = bc.idle
		p.mu.Unlock()
		p.prune(f)
		p.mu.Lock()
	}
	if p.closed || len(p.idle[bc.key]) >= max {
		p.mu.Unlock()
		f.closeBackend(bc)
		return
	}
	if p.idle == nil {
		p.idle = make(map[poolKey][]*backendConn)
	}
	p.idle[bc.key] = append(p.idle[bc.key], bc)
	p.mu.Unlock()
}

// pruneEvery is how often put closes the pool's expired connections (there
// is no goroutine for it: a pool nobody puts to is closed by get or Close).
const pruneEvery = time.Second

// prune closes the idle connections unused for longer than their maxIdle.
func (p *pool) prune(f *Forwarder) {
	now := time.Now()
	var stale []*backendConn
	p.mu.Lock()
	for k, list := range p.idle {
		keep := list[:0]
		for _, bc := range list {
			if now.Sub(bc.idle) >= bc.maxIdle {
				stale = append(stale, bc)
			} else {
				keep = append(keep, bc)
			}
		}
		clear(list[len(keep):])
		if len(keep) == 0 {
			delete(p.idle, k)
		} else {
			p.idle[k] = keep
		}
	}
	p.mu.Unlock()
	for _, bc := range stale {
		f.closeBackend(bc)
	}
}

// closeAll closes every idle connection; later puts close theirs.
func (p *pool) closeAll(f *Forwarder) {
	p.mu.Lock()
	p.closed = true
	var all []*backendConn
	for k, list := range p.idle {
		all = append(all, list...)
		delete(p.idle, k)
	}
	p.mu.Unlock()
	for _, bc := range all {
		f.closeBackend(bc)
	}
}

// idleCount is the number of pooled connections now.
func (p *pool) idleCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, list := range p.idle {
		n += len(list)
	}
	return n
}

// dialBackend opens a target connection for an http request and registers
// it for the sampler. client is the client connection that asked.
func (f *Forwarder) dialBackend(req *proxy.ConnRequest, d proxy.Decision, client *Conn, k poolKey, timeout time.Duration) (*backendConn, error) {
	leg, err := f.dial(d, timeout)
	if err != nil {
		return nil, err
	}
	e := &connEntry{req: *req, d: d, start: f.now(), client: client, target: leg}
	e.req.ID = f.nextID.Add(1)
	e.lastIO.Store(e.start.UnixNano())
	e.last.at = e.start
	f.mu.Lock()
	closed := f.closed
	if !closed {
		f.conns[e.req.ID] = e
	}
	f.mu.Unlock()
	if closed {
		leg.Close()
		return nil, errForwarderClosed
	}
	f.backends.Add(1)
	m := &meteredLeg{Leg: leg, e: e, now: f.opts.Now}
	return &backendConn{key: k, leg: leg, entry: e, br: bufio.NewReaderSize(m, 16<<10), bw: bufio.NewWriterSize(m, 16<<10)}, nil
}

// lend gives a target connection from the pool to the request of d.
func (f *Forwarder) lend(bc *backendConn, req *proxy.ConnRequest, d proxy.Decision) {
	f.hand(bc.entry, req, &d)
}

// park takes a target connection back from its request before it goes to
// the pool.
func (f *Forwarder) park(bc *backendConn) { f.hand(bc.entry, nil, nil) }

// closeBackend closes a target connection and takes its final counters
// into the sampler.
func (f *Forwarder) closeBackend(bc *backendConn) {
	f.finish(bc.entry)
	bc.leg.Close()
	f.backends.Add(-1)
}

// meteredLeg counts the bytes moved on a target leg into its connEntry, as
// the splice does, for the sampler.
type meteredLeg struct {
	proxy.Leg
	e   *connEntry
	now func() time.Time // the forwarder's clock
	// rd and wr meter each direction's reads for streamNs, as each splice
	// half does (see proxy.StreamMeter); one reader and one writer at a time.
	rd, wr proxy.StreamMeter
}

func (m *meteredLeg) Read(b []byte) (int, error) {
	n, err := m.Leg.Read(b)
	if n > 0 {
		m.e.toClient.Add(uint64(n))
		m.moved(&m.rd, n)
	}
	return n, err
}

func (m *meteredLeg) Write(b []byte) (int, error) {
	n, err := m.Leg.Write(b)
	if n > 0 {
		m.e.toTarget.Add(uint64(n))
		m.moved(&m.wr, n)
	}
	return n, err
}

func (m *meteredLeg) moved(sm *proxy.StreamMeter, n int) {
	now := m.now().UnixNano()
	if cr := sm.Read(now, now-m.e.lastIO.Swap(now), n); cr > 0 {
		m.e.streamNs.Add(cr)
	}
}
