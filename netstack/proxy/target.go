package proxy

// Target connections kept without a splice
//
// An http virtual server's target connections (weir/netstack/proxy/http's
// pool) carry one request after another and are never spliced, but they
// are registered like a spliced connection (a connEntry in the proxy's
// registry) for as long as they are open, so Sample and Conns see their
// segments, retransmissions, timeouts and bytes: the weights of an http
// service follow the same measurements as those of a tcp one. What a
// target connection does belongs to the request in flight on it: Lend and
// Park settle its activity with the request that is done and hand it to the
// next one, its action and client (Proxy.hand); idle in the pool it is its
// target's alone, no service level's, and not an active connection. The
// entry's client leg stays the client connection that opened it.

import (
	"sync"
	"time"
)

// Target is a target connection registered for Sample and Conns but not
// spliced (DialTarget's). Its methods are for the one goroutine using it
// at a time.
type Target struct {
	p   *Proxy
	e   *connEntry
	leg *meteredLeg
}

// DialTarget dials the target of an Accept decision d for the request req
// of client, within timeout, and registers the connection: its activity is
// req's (d's action) until Park. A dial after Close fails with ErrClosed.
func (p *Proxy) DialTarget(req *ConnRequest, d Decision, client Client, timeout time.Duration) (*Target, error) {
	leg, err := p.dial(req, d, timeout)
	if err != nil {
		return nil, err
	}
	e := &connEntry{req: *req, d: d, start: p.Now(), client: client, target: leg}
	e.req.ID = p.nextID.Add(1)
	e.lastIO.Store(e.start.UnixNano())
	e.last.at = e.start
	p.mu.Lock()
	closed := p.closed
	if !closed {
		p.conns[e.req.ID] = e
	}
	p.mu.Unlock()
	if closed {
		leg.Close()
		return nil, ErrClosed
	}
	return &Target{p: p, e: e, leg: &meteredLeg{Leg: leg, e: e, now: p.opts.Now}}, nil
}

// Leg is the target connection, metered: what is read from it and written
// to it counts for the sampler.
func (t *Target) Leg() Leg { return t.leg }

// Unacked returns the bytes written to the target that it has not
// acknowledged yet: nonzero after a request was written means the request
// is not with the target whole (lost on the way, or the target stopped
// reading), so its silence is not yet the target's.
func (t *Target) Unacked() uint64 { return t.p.unacked(t.e) }

// Sent is the number of bytes written to the target so far.
func (t *Target) Sent() uint64 { return t.e.toTarget.Load() }

// Lend gives the connection (from a pool) to the request req, decided d.
func (t *Target) Lend(req *ConnRequest, d Decision) { t.p.hand(t.e, req, &d) }

// Park takes the connection back from its request before it goes to a
// pool: it belongs to no one until the next Lend.
func (t *Target) Park() { t.p.hand(t.e, nil, nil) }

// Close closes the connection and takes its final counters into the
// sampler.
func (t *Target) Close() {
	t.p.finish(t.e)
	t.leg.Close()
}

// meteredLeg counts the bytes moved on a target leg into its connEntry, as
// the splice does, for the sampler.
type meteredLeg struct {
	Leg
	e   *connEntry
	now func() time.Time // the proxy's clock
	// rd and wr meter each direction's reads for streamNs, as each splice
	// half does (see StreamMeter); one reader and one writer at a time.
	rd, wr StreamMeter
}

func (m *meteredLeg) Read(b []byte) (int, error) {
	n, err := m.Leg.Read(b)
	m.read(n)
	return n, err
}

// ReadLent implements Leg, metered as Read.
func (m *meteredLeg) ReadLent(pool *sync.Pool, bp *[]byte) (*[]byte, int, error) {
	bp, n, err := m.Leg.ReadLent(pool, bp)
	m.read(n)
	return bp, n, err
}

func (m *meteredLeg) read(n int) {
	if n > 0 {
		m.e.toClient.Add(uint64(n))
		m.moved(&m.rd, n)
	}
}

func (m *meteredLeg) Write(b []byte) (int, error) {
	n, err := m.Leg.Write(b)
	if n > 0 {
		m.e.toTarget.Add(uint64(n))
		m.moved(&m.wr, n)
	}
	return n, err
}

func (m *meteredLeg) moved(sm *StreamMeter, n int) {
	now := m.now().UnixNano()
	if cr := sm.Read(now, now-m.e.lastIO.Swap(now), n); cr > 0 {
		m.e.streamNs.Add(cr)
	}
}
