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
// Worse, a client that closes as soon as it has the whole response (ab
// does, by Content-Length) sends its FIN before weir's, and its next SYN
// right after: weir may admit the next connection before the stack has even
// processed that FIN.
//
// So the order is made certain where it matters, at the next admission:
// every spliced connection is in the closing set under its client's address
// until it is released. Before a new connection from that address is
// admitted, those that have both FINs (weir's sent, the client's in the
// leg's TCP state) are released; and an Admitter about to refuse calls
// ConnRequest.Settle, which waits (at most SettleWait) for the first of that
// client's other connections to be released, and admits again if any was.
// Only a refusal waits, and only a client with another connection open. A
// client that reconnects from another address (another host behind a NAT)
// was never waiting for this connection's end and is not owed the order.

import (
	"net/netip"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
)

// closingSet holds the open spliced connections by client address, until
// they are released.
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

// SettleWait bounds how long ConnRequest.Settle waits for one of the
// client's open connections to finish.
const SettleWait = 100 * time.Millisecond

// settle releases the connections of client ip that are done (weir's FIN
// sent, the client's in the leg's TCP state) and, with wait > 0 and none
// done, waits up to wait for any other of them to be released. It reports
// whether any of the set's connections was released since gen was since.
func (s *closingSet) settle(ip netip.Addr, wait time.Duration, since uint64) bool {
	s.mu.Lock()
	var done, open []*connEntry
	for c := range s.m[ip] {
		if c.clientClosed.Load()&clientSndClosed != 0 && rcvClosed(c.client.state()) {
			done = append(done, c)
		} else {
			open = append(open, c)
		}
	}
	s.mu.Unlock()
	for _, c := range done {
		c.release() // removes c from the set
	}
	if s.gen.Load() != since || len(open) == 0 || wait <= 0 {
		return s.gen.Load() != since
	}
	// Wait for the first of them: the one the client has finished with
	// (its FIN still queued in the stack) is released as soon as the
	// stack has processed it.
	cases := make([]reflect.SelectCase, 0, len(open)+1)
	t := time.NewTimer(wait)
	defer t.Stop()
	cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(t.C)})
	for _, c := range open {
		cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(c.released)})
	}
	reflect.Select(cases)
	return s.gen.Load() != since
}

// PreSettleWait bounds the wait before an admission for a client's
// connections that are half way through their close.
const PreSettleWait = 20 * time.Millisecond

// closingRecent is how recent the first close must be for the wait before
// admission: a connection half closed for longer is not closing because its
// client is reconnecting.
const closingRecent = time.Second

// preSettle runs before each admission: it releases the client's finished
// connections and waits (at most PreSettleWait) for those half way through
// their close (one of the two FINs passed within closingRecent), whose other
// FIN is in flight or queued in the stack. A client's previous connection
// is then released before its next one is admitted, and a limit is not
// even probed (a failed probe counts, in the balancer, as a refusal).
func (s *closingSet) preSettle(ip netip.Addr) {
	s.mu.Lock()
	var done, closing []*connEntry
	now := time.Now().UnixNano()
	for c := range s.m[ip] {
		switch bits := c.clientClosed.Load(); {
		case bits&clientSndClosed != 0 && rcvClosed(c.client.state()):
			done = append(done, c)
		case bits != 0 && now-c.firstClose.Load() < int64(closingRecent):
			closing = append(closing, c)
		}
	}
	s.mu.Unlock()
	for _, c := range done {
		c.release()
	}
	if len(closing) == 0 {
		return
	}
	t := time.NewTimer(PreSettleWait)
	defer t.Stop()
	for _, c := range closing {
		select {
		case <-c.released:
		case <-t.C:
			return
		}
	}
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
