package netstack

// Release on the client's FIN
//
// A connection is over for its client once both FINs have passed (or it was
// reset): from then on its slots (admission ticket, target slot) must be
// free, or a client that reconnects at once (`ab -c 1`) is refused. The copy
// halves release as soon as they see the second close (see splice.go), but
// when weir's FIN went first the second close is the client's FIN, which
// the client→target half learns of only when its goroutine runs again, and
// the client's next connection may be admitted first.
//
// Nor does the stack's own order help: gVisor processes segments on
// processor goroutines picked by 4-tuple, so the client's FIN may still be
// queued when its next connection's handshake completes (the lab shows it
// within 20 sequential connections).
//
// So the order is made certain where it matters, at the next admission:
// a connection whose FIN weir has sent waits in the closing set under its
// client's address. Before a new connection from that address is admitted,
// those whose client leg already has the client's FIN are released; and an
// Admitter about to refuse calls ConnRequest.Settle, which waits (at most
// SettleWait) for the rest of that client's closing connections to see
// their FIN, and admits again if any was released. Only a refusal waits,
// and only for a client with a connection in that state. A client that
// reconnects from another address (another host behind a NAT) was never
// waiting for this connection's end and is not owed the order.

import (
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
)

// closingSet holds the spliced connections whose FIN weir has sent to the
// client and whose client's FIN has not been seen yet, by client address.
type closingSet struct {
	mu sync.Mutex
	m  map[netip.Addr]map[*connEntry]struct{} // protected by mu
	// gen counts the connections that left the set: a settle that finds
	// nothing left to wait for still reports a release that completed
	// since its caller's admission began.
	gen atomic.Uint64
}

func (s *closingSet) add(c *connEntry) {
	ip := c.req.Client.Addr()
	s.mu.Lock()
	if c.gone {
		// Released already (both FINs crossed): nothing to wait for.
		s.mu.Unlock()
		return
	}
	if s.m == nil {
		s.m = make(map[netip.Addr]map[*connEntry]struct{})
	}
	set := s.m[ip]
	if set == nil {
		set = make(map[*connEntry]struct{}, 1)
		s.m[ip] = set
	}
	set[c] = struct{}{}
	s.mu.Unlock()
}

func (s *closingSet) remove(c *connEntry) {
	ip := c.req.Client.Addr()
	s.mu.Lock()
	c.gone = true
	s.gen.Add(1)
	if set := s.m[ip]; set != nil {
		delete(set, c)
		if len(set) == 0 {
			delete(s.m, ip)
		}
	}
	s.mu.Unlock()
}

// SettleWait bounds how long ConnRequest.Settle waits for the FINs of a
// client's closing connections.
const SettleWait = 100 * time.Millisecond

// settleRecent is how recent weir's FIN must be for Settle to wait for the
// client's answer.
const settleRecent = time.Second

// settle releases the connections of client ip that are done: at once
// those whose client leg has received the client's FIN, and, waiting up to
// wait, the rest as their FIN is read. It reports whether any was released,
// by it or by another goroutine since the set's gen was since.
func (s *closingSet) settle(ip netip.Addr, wait time.Duration, since uint64) bool {
	s.mu.Lock()
	var done, open []*connEntry
	now := time.Now()
	for c := range s.m[ip] {
		switch {
		case rcvClosed(c.client.state()):
			done = append(done, c)
		case now.Sub(c.sndClosedAt) < settleRecent:
			open = append(open, c)
		}
		// A client that has not answered weir's FIN for settleRecent
		// is not reconnecting because of it: no refusal waits for it.
	}
	s.mu.Unlock()
	for _, c := range done {
		c.release() // removes c from the set
	}
	released := len(done) > 0 || s.gen.Load() != since
	if len(open) == 0 || wait <= 0 {
		return released
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	for _, c := range open {
		select {
		case <-c.released:
			released = true
		case <-t.C:
			return released
		}
	}
	return released
}

// rcvClosed reports whether a connection in state st has received its
// peer's FIN (or is gone).
func rcvClosed(st tcp.EndpointState) bool {
	switch st {
	case tcp.StateCloseWait, tcp.StateLastAck, tcp.StateClosing, tcp.StateTimeWait, tcp.StateClose, tcp.StateError:
		return true
	}
	return false
}
