package proxy

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
)

// PeerCloser is a client leg that tells whether it has received its peer's
// FIN (or is gone): netstack.Conn reads it from the gVisor endpoint's TCP
// state.
type PeerCloser interface {
	PeerClosed() bool
}

// The client-side closes of a Release, for ClientDone.
const (
	ClientRcvClosed uint32 = 1 << iota // the client's FIN (or an error) was read
	ClientSndClosed                    // weir's FIN was sent to the client
	clientFinished  = ClientRcvClosed | ClientSndClosed
)

// Release is one spliced connection's release on the client's FIN: it tells
// its Session, once, that the client is done with the connection, and keeps
// it in its ClosingSet until then. A nil *Release does nothing (an http
// target connection has none: its requests' Sessions hear Released from the
// request proxy).
type Release struct {
	client netip.Addr
	leg    PeerCloser
	sess   Session
	set    *ClosingSet
	// closed holds ClientRcvClosed and ClientSndClosed; the half that sets
	// the second calls Release.
	closed     atomic.Uint32
	firstClose atomic.Int64 // unix ns of the first of the two
	once       sync.Once
	released   chan struct{} // closed when Release has run
	// mu orders Report's call before Release's: the Session hears at
	// most one of them at a time.
	mu sync.Mutex
}

// ClientDone records one client-side close; once both are done the
// connection is finished as the client sees it and its slots are released.
func (r *Release) ClientDone(bit uint32) {
	if r == nil {
		return
	}
	old := r.closed.Or(bit)
	if old == 0 {
		r.firstClose.Store(time.Now().UnixNano())
	}
	if old|bit == clientFinished {
		r.Release()
	}
}

// Release tells the Session, once, that the client is done with the
// connection. A second caller waits until the first call has returned, so
// an End that calls it first always follows Released.
func (r *Release) Release() {
	if r == nil {
		return
	}
	r.once.Do(func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.sess.Released()
		// Only now: a settle that finds r in the set waits for this.
		r.set.remove(r)
		close(r.released)
	})
}

// Report runs f (a Session call such as TargetFailed) unless the
// connection was released already, and reports whether it ran: a failure
// of the target reported before the release still holds the target's slot,
// the lease the Session marks down with (a lease released first has
// nothing left to mark). A Release that comes meanwhile waits for f. A nil
// *Release runs f.
func (r *Release) Report(f func()) bool {
	if r == nil {
		f()
		return true
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	select {
	case <-r.released:
		return false
	default:
	}
	f()
	return true
}

// finished reports whether both FINs have passed: weir's sent, the
// client's in the leg's TCP state.
func (r *Release) finished() bool {
	return r.closed.Load()&ClientSndClosed != 0 && r.leg.PeerClosed()
}

// ClosingSet holds the open spliced connections by client address, until
// they are released. The zero value is empty and ready.
type ClosingSet struct {
	mu sync.Mutex
	m  map[netip.Addr]map[*Release]struct{} // protected by mu
	// gen counts the connections that left the set: a settle that finds
	// nothing left to wait for still reports a release that completed
	// since its caller's admission began.
	gen atomic.Uint64
}

// Track adds a spliced connection from client, whose client leg is leg and
// whose Session is sess, and returns its Release.
func (s *ClosingSet) Track(client netip.Addr, leg PeerCloser, sess Session) *Release {
	r := &Release{client: client, leg: leg, sess: sess, set: s, released: make(chan struct{})}
	s.mu.Lock()
	if s.m == nil {
		s.m = make(map[netip.Addr]map[*Release]struct{})
	}
	set := s.m[client]
	if set == nil {
		set = make(map[*Release]struct{}, 1)
		s.m[client] = set
	}
	set[r] = struct{}{}
	s.mu.Unlock()
	return r
}

func (s *ClosingSet) remove(r *Release) {
	s.mu.Lock()
	s.gen.Add(1)
	if set := s.m[r.client]; set != nil {
		delete(set, r)
		if len(set) == 0 {
			delete(s.m, r.client)
		}
	}
	s.mu.Unlock()
}

// Gen returns the count of releases so far, for Settle's since.
func (s *ClosingSet) Gen() uint64 { return s.gen.Load() }

// Settle releases the connections of client ip that are done (weir's FIN
// sent, the client's in the leg's TCP state) and, with wait > 0 and none
// done, waits up to wait for any other of them to be released. It reports
// whether any of the set's connections was released since Gen was since.
func (s *ClosingSet) Settle(ip netip.Addr, wait time.Duration, since uint64) bool {
	s.mu.Lock()
	var done, open []*Release
	for r := range s.m[ip] {
		if r.finished() {
			done = append(done, r)
		} else {
			open = append(open, r)
		}
	}
	s.mu.Unlock()
	for _, r := range done {
		r.Release() // removes r from the set
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
	for _, r := range open {
		cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(r.released)})
	}
	reflect.Select(cases)
	return s.gen.Load() != since
}

// SettleWait bounds how long ConnRequest.Settle waits for one of the
// client's open connections to finish.
const SettleWait = 100 * time.Millisecond

// PreSettleWait bounds the wait before an admission for a client's
// connections that are half way through their close.
const PreSettleWait = 20 * time.Millisecond

// closingRecent is how recent the first close must be for the wait before
// admission: a connection half closed for longer is not closing because its
// client is reconnecting.
const closingRecent = time.Second

// PreSettle runs before each admission: it releases the client's finished
// connections and waits (at most PreSettleWait) for those half way through
// their close (one of the two FINs passed within closingRecent), whose other
// FIN is in flight or queued in the stack. A client's previous connection
// is then released before its next one is admitted, and a limit is not
// even probed (a failed probe counts, in the balancer, as a refusal).
func (s *ClosingSet) PreSettle(ip netip.Addr) {
	s.mu.Lock()
	var done, closing []*Release
	now := time.Now().UnixNano()
	for r := range s.m[ip] {
		switch bits := r.closed.Load(); {
		case bits&ClientSndClosed != 0 && r.leg.PeerClosed():
			done = append(done, r)
		case bits != 0 && now-r.firstClose.Load() < int64(closingRecent):
			closing = append(closing, r)
		}
	}
	s.mu.Unlock()
	for _, r := range done {
		r.Release()
	}
	if len(closing) == 0 {
		return
	}
	t := time.NewTimer(PreSettleWait)
	defer t.Stop()
	for _, r := range closing {
		select {
		case <-r.released:
		case <-t.C:
			return
		}
	}
}
