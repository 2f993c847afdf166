package http

// Target connection pool (http virtual servers)
//
//	request routed to a target ──► pool.get: the newest idle connection to
//	    that target (service, target, address) that is still open, else
//	    Proxy.DialTarget (the same dial path as a spliced connection: host
//	    socket or back arm, so the datapath measures the leg)
//	response complete, both sides agree to keep it ──► pool.put (at most
//	    MaxIdlePerTarget idle per target; older than BackendIdle: closed)
//
// Every target connection, pooled or not, is a proxy.Target: registered
// with the proxy for Sample and Conns for as long as it is open, its
// activity the request's in flight on it (Lend when pool.get gives it to a
// request, Park before pool.put), idle in the pool its target's alone
// (see netstack/proxy's target.go).

import (
	"bufio"
	"net/netip"
	"sync"
	"time"

	"weir/netstack/proxy"
	"weir/policy"
)

// poolKey names the idle connections that may serve a request: the same
// service and target, reached the same way. A target with a
// PROXY-protocol header gets the header once, first on the connection,
// naming one client: its connections are keyed by that client's address
// and port and the VIP too (the header's content), so a client's kept-alive
// requests reuse its own target connections and no other client's, and
// they are closed when the client connection ends (drop).
type poolKey struct {
	service, target string
	via             policy.DialVia
	addr            string
	client, vip     netip.AddrPort // zero but for a PROXY-protocol target
}

// backendConn is one target connection of an http virtual server.
type backendConn struct {
	key     poolKey
	leg     proxy.Leg // t's metered leg
	t       *proxy.Target
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
func (p *pool) get(s *Server, k poolKey, maxIdle time.Duration) *backendConn {
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
		s.closeBackend(bc)
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
func (p *pool) put(s *Server, bc *backendConn, max int, maxIdle time.Duration) {
	bc.idle, bc.maxIdle = time.Now(), maxIdle
	p.mu.Lock()
	if bc.idle.Sub(p.lastPrune) >= pruneEvery {
		p.lastPrune = bc.idle
		p.mu.Unlock()
		p.prune(s)
		p.mu.Lock()
	}
	if p.closed || len(p.idle[bc.key]) >= max {
		p.mu.Unlock()
		s.closeBackend(bc)
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
func (p *pool) prune(s *Server) {
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
		s.closeBackend(bc)
	}
}

// drop closes the idle connections under k (a client's own, at its end).
func (p *pool) drop(s *Server, k poolKey) {
	p.mu.Lock()
	list := p.idle[k]
	delete(p.idle, k)
	p.mu.Unlock()
	for _, bc := range list {
		s.closeBackend(bc)
	}
}

// closeAll closes every idle connection; later puts close theirs.
func (p *pool) closeAll(s *Server) {
	p.mu.Lock()
	p.closed = true
	var all []*backendConn
	for k, list := range p.idle {
		all = append(all, list...)
		delete(p.idle, k)
	}
	p.mu.Unlock()
	for _, bc := range all {
		s.closeBackend(bc)
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
func (s *Server) dialBackend(p *proxy.Proxy, req *proxy.ConnRequest, d proxy.Decision, client proxy.Client, k poolKey, timeout time.Duration) (*backendConn, error) {
	t, err := p.DialTarget(req, d, client, timeout)
	if err != nil {
		return nil, err
	}
	s.backends.Add(1)
	m := t.Leg()
	return &backendConn{key: k, leg: m, t: t, br: bufio.NewReaderSize(m, 16<<10), bw: bufio.NewWriterSize(m, 16<<10)}, nil
}

// closeBackend closes a target connection and takes its final counters
// into the sampler.
func (s *Server) closeBackend(bc *backendConn) {
	bc.t.Close()
	s.backends.Add(-1)
}
