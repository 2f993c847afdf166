// Package udp relays the datagrams of udp virtual servers: a session per
// client address and port with the VIP and port it sent to, created by its
// first datagram, admitted and balanced like a TCP connection (one
// proxy.Admitter call, one proxy.Session), and ended by its idle timeout or
// once its target sent the configured number of replies.
//
//	VIP socket reader (one goroutine per VIP and port: the client's order)
//	    ──► Datagram: key (client, VIP) in the table?
//	          yes ──► written to the session's target socket as it came
//	          no  ──► table or VIP bound reached: dropped        DroppedFull, DroppedVIP
//	              ──► Admit: refused: dropped (no ICMP)           Refused
//	              ──► dial (a connected socket per session)       DialFailed → the next pick
//	              ──► session, its reader goroutine, the datagram written
//	session reader (one per session: the target's order)
//	    ──► each datagram to the client from the VIP socket; the N-th reply of
//	        udp.responses ends the session
//	Sweep (a timer on the earliest deadline): idle sessions end
//
// Expiry is a min-heap of sessions by deadline with lazy deadlines: a
// datagram only stores its time in its session (one atomic store, no lock,
// no heap work); when a session reaches the top of the heap its real
// deadline (last datagram + idle timeout) is checked, and it either ends
// or goes back with that deadline. A session is so looked at about once
// per idle timeout, never per packet, and no sweep scans the table.
//
// The package imports no gVisor (deps_test.go): the VIP socket (Replier)
// and the target sockets (Dialer, Target) are interfaces, implemented by
// weir/netstack for the stack and for host sockets.
package udp

import (
	"container/heap"
	"context"
	"errors"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"weir/netstack/proxy"
	"weir/policy"
)

// DefaultMaxSessions bounds the whole table where Options.MaxSessions is
// zero: a transport bound on memory and sockets (each session holds one
// target socket); each VIP and port has its service's udp.maxSessions too.
const DefaultMaxSessions = 65536

// MaxDatagram is the largest datagram relayed (the largest UDP payload).
const MaxDatagram = 65535

// dialTimeout bounds one target dial; a connected UDP socket does not
// wait on the network, so only a stuck back arm could take this long.
const dialTimeout = 3 * time.Second

// maxDials bounds the dials one new session makes (the balancer's
// tried-set bounds them first).
const maxDials = 16

// Replier sends a datagram to a client from the VIP and port the client
// sent to: the VIP socket. It must be safe for concurrent use.
type Replier interface {
	WriteTo(b []byte, client netip.AddrPort) error
}

// Target is a session's target socket: connected to the target, one
// datagram per Write and per ReadDatagram.
type Target interface {
	// ReadDatagram waits for the next datagram with no buffer held, then
	// reads it into a buffer from pool (of *[]byte of MaxDatagram bytes)
	// and returns it; the caller puts it back. After Close it returns an
	// error.
	ReadDatagram(pool *sync.Pool) (bp *[]byte, n int, err error)
	Write(b []byte) (int, error)
	Close() error
}

// Dialer opens a session's target socket.
type Dialer interface {
	DialUDP(ctx context.Context, addr netip.AddrPort) (Target, error)
}

// Options configure a Relay. Admitter is required.
type Options struct {
	// Admitter admits each new session (weir's cmd/weir/internal/admit):
	// its limits and balancer see one connection per session.
	Admitter proxy.Admitter
	// Host dials targets with via: host, Back those with via: netstack;
	// a nil one fails the dial (the next target is tried).
	Host, Back Dialer
	// MaxSessions bounds the table; zero means DefaultMaxSessions.
	MaxSessions int
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Stats are the relay's counters, totals since New except Sessions.
type Stats struct {
	Sessions    int64  // open now
	Created     uint64 // sessions admitted and dialed
	Refused     uint64 // new sessions' datagrams dropped: admission refused them (a limit, no target)
	DroppedFull uint64 // new sessions' datagrams dropped: the table was full
	DroppedVIP  uint64 // new sessions' datagrams dropped: their VIP and port had udp.maxSessions open
	DialFailed  uint64 // target dials that failed
	// Ended by reason: the idle timeout, udp.responses replies, no reply
	// within udp.responseTimeout (Unanswered), a target socket error (ICMP
	// unreachable from the target), Close.
	EndedIdle, EndedResponses, EndedUnanswered, EndedError, EndedClosed uint64
	// Datagrams and payload bytes relayed: In from clients to targets,
	// Out from targets to clients.
	DatagramsIn, DatagramsOut, BytesIn, BytesOut uint64
	// WriteErrors: datagrams that could not be written (to a target or to
	// a client); each is lost, as on a wire.
	WriteErrors uint64
}

// key is a session's identity: the client's address and port and the VIP
// and port it sent to.
type key struct{ client, vip netip.AddrPort }

// Relay is the session table and the relay of udp services. Its methods are
// safe for concurrent use; Datagram must be called by one goroutine per VIP
// and port (the order of that goroutine's calls is the order relayed).
type Relay struct {
	opts Options
	now  func() time.Time
	max  int
	pool sync.Pool

	mu     sync.Mutex
	table  map[key]*session       // by mu
	perVIP map[netip.AddrPort]int // by mu: places per VIP and port (sessions and those being made)
	total  int                    // by mu: the sum of perVIP
	exp    expiry                 // by mu
	closed bool                   // by mu

	amu     sync.Mutex
	answers map[TargetKey]Answers       // by amu: since the last Sample
	lat     map[TargetKey]*replyLatency // by amu: request/response targets' reply latency

	wake chan struct{} // a session became the heap's top: the sweeper's timer moves
	wg   sync.WaitGroup

	created, refused, droppedFull, droppedVIP, dialFailed               atomic.Uint64
	endedIdle, endedResponses, endedUnanswered, endedError, endedClosed atomic.Uint64
	dgIn, dgOut, bytesIn, bytesOut, writeErrors                         atomic.Uint64
	open                                                                atomic.Int64
	lastID                                                              atomic.Uint64
}

// New returns a Relay; Run sweeps its idle sessions.
func New(o Options) *Relay {
	r := &Relay{opts: o, now: o.Now, max: o.MaxSessions, table: map[key]*session{},
		perVIP: map[netip.AddrPort]int{}, wake: make(chan struct{}, 1)}
	if r.now == nil {
		r.now = time.Now
	}
	if r.max <= 0 {
		r.max = DefaultMaxSessions
	}
	r.pool.New = func() any { b := make([]byte, MaxDatagram); return &b }
	return r
}

// endReason is why a session ended.
type endReason uint8

const (
	endIdle endReason = iota
	endResponses
	endUnanswered
	endError
	endClosed
)

// session is one client address and port with its VIP and port.
type session struct {
	r       *Relay
	key     key
	id      uint64
	vs      *policy.VirtualServer
	out     Replier
	adm     proxy.Session
	dec     proxy.Decision
	target  Target
	start   time.Time
	idle    int64         // the idle timeout, ns
	replies int           // udp.responses; 0: none
	answer  int64         // udp.responseTimeout, ns, when replies > 0
	lat     *replyLatency // its target's, when replies > 0

	// pending is the time of the oldest client datagram the target has
	// not answered yet, ns since the epoch; 0: none (request/response
	// sessions only).
	pending atomic.Int64

	last     atomic.Int64 // the last datagram's time, ns since the epoch
	got      atomic.Int64 // replies relayed
	ended    atomic.Bool
	deadline int64 // by r.mu: the deadline the heap orders it by
	idx      int   // by r.mu: its index in the heap, -1 when out

	dgIn, dgOut, bytesIn, bytesOut atomic.Uint64
}

// Datagram relays one datagram b from client to vip, a VIP and port of vs
// (a udp service); out answers the client from vip. b is only read during
// the call. A datagram that starts a session the relay cannot or may not
// create is dropped and counted; nothing is sent back for it.
func (r *Relay) Datagram(out Replier, client, vip netip.AddrPort, vs *policy.VirtualServer, b []byte) {
	if s := r.accept(out, client, vip, vs, b); s != nil {
		_, err := s.target.Write(b)
		r.wrote(s, 1, err)
	}
}

// accept finds or creates the session of a datagram b from client to vip
// and counts b in it; nil: b is dropped (counted).
func (r *Relay) accept(out Replier, client, vip netip.AddrPort, vs *policy.VirtualServer, b []byte) *session {
	k := key{client, vip}
	now := r.now()
	r.mu.Lock()
	s := r.table[k]
	r.mu.Unlock()
	if s == nil {
		if s = r.create(out, k, vs, now); s == nil {
			return nil
		}
	}
	s.last.Store(now.UnixNano())
	if s.lat != nil {
		s.pending.CompareAndSwap(0, now.UnixNano())
	}
	// Counted before the write: the reply may end the session before
	// Write returns.
	s.dgIn.Add(1)
	s.bytesIn.Add(uint64(len(b)))
	r.dgIn.Add(1)
	r.bytesIn.Add(uint64(len(b)))
	return s
}

// wrote counts the outcome of writing n datagrams to s's target: err
// lost them (each is counted), and a target error other than its close
// ends the session.
func (r *Relay) wrote(s *session, n int, err error) {
	if err == nil {
		return
	}
	r.writeErrors.Add(uint64(n))
	if !isClosed(err) {
		r.end(s, endError, err)
	}
}

// BatchWriter is a Target that writes several datagrams in one call
// (sendmmsg for a kernel socket). It returns how many it wrote; on an
// error the rest were not written.
type BatchWriter interface {
	WriteBatch(bs [][]byte) (int, error)
}

// Batch gathers the datagrams one VIP reader relays while more are
// waiting behind them (Relay.Queue), so that Relay.Flush writes each
// session's run of them to its target in one call. One per reader
// goroutine; the zero value is ready.
type Batch struct {
	arena []byte // copies of the datagrams queued
	items []queued
	bufs  [][]byte
}

type queued struct {
	s      *session
	off, n int
}

// A Batch holds at most batchMax datagrams and batchArena bytes: 64
// datagrams of a stream, a few hundred microseconds of a saturated link,
// in one system call.
const (
	batchMax   = 64
	batchArena = 256 << 10
)

// Queue is Datagram for a reader that calls Flush before it waits for
// the next datagram: b is copied into bt and written at the Flush (or at
// a Queue that finds bt full), with the datagrams of the same session
// queued right before and after it, when its target is a BatchWriter
// (otherwise at once, as Datagram). Each session's datagrams keep their
// order.
func (r *Relay) Queue(bt *Batch, out Replier, client, vip netip.AddrPort, vs *policy.VirtualServer, b []byte) {
	s := r.accept(out, client, vip, vs, b)
	if s == nil {
		return
	}
	if _, ok := s.target.(BatchWriter); !ok {
		_, err := s.target.Write(b)
		r.wrote(s, 1, err)
		return
	}
	if len(bt.items) == batchMax || len(bt.arena)+len(b) > batchArena {
		r.Flush(bt)
	}
	if bt.arena == nil {
		bt.arena = make([]byte, 0, batchArena)
	}
	bt.items = append(bt.items, queued{s: s, off: len(bt.arena), n: len(b)})
	bt.arena = append(bt.arena, b...)
}

// Flush writes the datagrams queued in bt, each run of one session's in
// one WriteBatch, and empties bt.
func (r *Relay) Flush(bt *Batch) {
	for i := 0; i < len(bt.items); {
		s := bt.items[i].s
		bt.bufs = bt.bufs[:0]
		for ; i < len(bt.items) && bt.items[i].s == s; i++ {
			q := bt.items[i]
			bt.bufs = append(bt.bufs, bt.arena[q.off:q.off+q.n])
		}
		n, err := s.target.(BatchWriter).WriteBatch(bt.bufs)
		if err != nil {
			r.wrote(s, len(bt.bufs)-n, err)
		}
	}
	clear(bt.items) // no session kept alive by a stale pointer
	clear(bt.bufs)
	bt.items, bt.bufs, bt.arena = bt.items[:0], bt.bufs[:0], bt.arena[:0]
}

// create admits, dials and enters a new session, or counts why not.
func (r *Relay) create(out Replier, k key, vs *policy.VirtualServer, now time.Time) *session {
	if !r.reserve(k.vip, vs.UDP.MaxSessions) {
		return nil
	}
	placed := false
	defer func() {
		if !placed {
			r.unreserve(k.vip)
		}
	}()
	req := &proxy.ConnRequest{ID: r.lastID.Add(1), Client: k.client, VIP: k.vip, Service: vs}
	d, adm := r.opts.Admitter.Admit(req)
	s := &session{r: r, key: k, id: req.ID, vs: vs, out: out, adm: adm, start: now,
		idle: int64(vs.UDP.IdleTimeout), replies: vs.UDP.Responses, answer: int64(vs.UDP.ResponseTimeout), idx: -1}
	for i := 0; d.Verdict == proxy.Accept && adm != nil && i < maxDials; i++ {
		t, err := r.dial(d)
		if err == nil {
			s.dec, s.target = d, t
			break
		}
		r.dialFailed.Add(1)
		req.Attempt++
		d = adm.DialFailed(d, err)
	}
	if s.target == nil {
		r.refused.Add(1)
		if adm != nil {
			if d.Verdict == proxy.Accept { // maxDials reached
				d = proxy.Decision{Verdict: proxy.RefuseRST, Reason: "every dial failed"}
			}
			adm.End(&proxy.End{Outcome: proxy.RefusedReset, Decision: d, Dials: req.Attempt,
				Stats: proxy.ConnStats{ID: req.ID, Client: k.client, VIP: k.vip, Service: vs.Name, Start: now}})
		}
		return nil
	}
	s.last.Store(now.UnixNano())
	if s.replies > 0 {
		s.lat = r.latencyOf(TargetKey{vs.Name, s.dec.Target.Name})
	}
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		s.target.Close()
		adm.End(&proxy.End{Outcome: proxy.Aborted, Decision: d, Stats: s.stats()})
		return nil
	}
	r.table[k] = s
	s.deadline, _ = s.due()
	heap.Push(&r.exp, s)
	top := s.idx == 0
	r.wg.Add(1)
	r.mu.Unlock()
	placed = true
	r.open.Add(1)
	r.created.Add(1)
	if top {
		select {
		case r.wake <- struct{}{}:
		default:
		}
	}
	go s.readTarget()
	return s
}

// reserve takes a place in the table for a new session of vip, unless the
// table or vip's bound is full (counted).
func (r *Relay) reserve(vip netip.AddrPort, perVIP int) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.closed:
		return false
	case r.total >= r.max:
		r.droppedFull.Add(1)
		return false
	case perVIP > 0 && r.perVIP[vip] >= perVIP:
		r.droppedVIP.Add(1)
		return false
	}
	r.perVIP[vip]++
	r.total++
	return true
}

func (r *Relay) unreserve(vip netip.AddrPort) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.release(vip)
}

// release gives vip's place back. Call with mu held.
func (r *Relay) release(vip netip.AddrPort) {
	r.total--
	if r.perVIP[vip]--; r.perVIP[vip] <= 0 {
		delete(r.perVIP, vip)
	}
}

// dial opens the target socket of decision d.
func (r *Relay) dial(d proxy.Decision) (Target, error) {
	if d.Target == nil {
		return nil, errors.New("udp: accept without a target")
	}
	dl := r.opts.Host
	if d.Target.Via == policy.DialNetstack {
		dl = r.opts.Back
	}
	if dl == nil {
		return nil, errors.New("udp: no dialer for via " + d.Target.Via.String())
	}
	ctx, cancel := context.WithTimeout(context.Background(), dialTimeout)
	defer cancel()
	return dl.DialUDP(ctx, d.Target.Addr)
}

// readTarget relays the target's datagrams to the client until the session
// ends.
func (s *session) readTarget() {
	r := s.r
	defer r.wg.Done()
	for {
		bp, n, err := s.target.ReadDatagram(&r.pool)
		if err != nil {
			if bp != nil {
				r.pool.Put(bp)
			}
			if !s.ended.Load() && !isClosed(err) {
				// ICMP unreachable. Before any reply it is the target's
				// refusal (passive health, as a failed dial marks it
				// down); after replies, the server closed this session's
				// socket (a restart, the end of a stream whose client
				// still sends): the session ends, and only a new one that
				// meets it again marks the target down, so that one
				// client's trailing datagrams do not refuse every session
				// for the retry interval.
				if s.dgOut.Load() == 0 {
					s.adm.TargetFailed(s.dec, err)
				}
				r.end(s, endError, err)
			}
			return
		}
		now := r.now().UnixNano()
		s.last.Store(now)
		if s.lat != nil {
			if p := s.pending.Swap(0); p != 0 {
				s.lat.observe(time.Duration(now - p))
			}
		}
		werr := s.out.WriteTo((*bp)[:n], s.key.client)
		r.pool.Put(bp)
		if werr != nil {
			r.writeErrors.Add(1)
			continue
		}
		s.dgOut.Add(1)
		s.bytesOut.Add(uint64(n))
		r.dgOut.Add(1)
		r.bytesOut.Add(uint64(n))
		if s.replies > 0 && s.got.Add(1) >= int64(s.replies) {
			r.end(s, endResponses, nil)
			return
		}
	}
}

// end ends s once: out of the table and the heap, its socket closed, its
// slot and ticket given back, its End (the access-log line) reported.
func (r *Relay) end(s *session, why endReason, err error) {
	if !s.ended.CompareAndSwap(false, true) {
		return
	}
	r.mu.Lock()
	if r.table[s.key] == s {
		delete(r.table, s.key)
	}
	if s.idx >= 0 {
		heap.Remove(&r.exp, s.idx)
	}
	r.release(s.key.vip)
	r.mu.Unlock()
	s.target.Close()
	r.open.Add(-1)
	outcome := proxy.Served
	switch why {
	case endIdle:
		r.endedIdle.Add(1)
		outcome = proxy.IdleClosed
	case endResponses:
		r.endedResponses.Add(1)
	case endUnanswered:
		r.endedUnanswered.Add(1)
		outcome = proxy.TargetTimedOut
	case endError:
		r.endedError.Add(1)
	case endClosed:
		r.endedClosed.Add(1)
		outcome = proxy.Aborted
	}
	if s.replies > 0 && why != endClosed {
		r.answered(s, why != endUnanswered)
	}
	s.adm.Released()
	s.adm.End(&proxy.End{Outcome: outcome, Decision: s.dec, Stats: s.stats(), Err: err})
}

// TargetKey names a target of a service, for Sample.
type TargetKey struct{ Service, Target string }

// Answers are one target's request/response sessions (udp.responses set)
// ended in an interval, and of those the ones with no reply within
// udp.responseTimeout.
type Answers struct {
	Sessions, Unanswered uint64
	// PolicySessions and PolicyUnanswered are those of Sessions and
	// Unanswered under a policy action (a rule matched their flow): what
	// monitor.scope policy judges.
	PolicySessions, PolicyUnanswered uint64
}

// answered counts an ended request/response session for its target.
func (r *Relay) answered(s *session, ok bool) {
	if s.dec.Target == nil {
		return
	}
	k := TargetKey{s.vs.Name, s.dec.Target.Name}
	r.amu.Lock()
	if r.answers == nil {
		r.answers = map[TargetKey]Answers{}
	}
	a := r.answers[k]
	a.Sessions++
	if !ok {
		a.Unanswered++
	}
	if s.dec.Action != nil {
		a.PolicySessions++
		if !ok {
			a.PolicyUnanswered++
		}
	}
	r.answers[k] = a
	r.amu.Unlock()
}

// Sample returns the request/response sessions per target that ended since
// the previous call (the sampling loop's interval) and starts a new count;
// the reply latencies' interval ends with it.
func (r *Relay) Sample() map[TargetKey]Answers {
	r.amu.Lock()
	defer r.amu.Unlock()
	out := r.answers
	r.answers = nil
	for _, l := range r.lat {
		l.rotate()
	}
	return out
}

// latencyOf is target k's reply latency, made at its first
// request/response session. The map keeps a target removed by a reload
// (a few KiB each): its totals stay true.
func (r *Relay) latencyOf(k TargetKey) *replyLatency {
	r.amu.Lock()
	defer r.amu.Unlock()
	l := r.lat[k]
	if l == nil {
		if r.lat == nil {
			r.lat = map[TargetKey]*replyLatency{}
		}
		l = &replyLatency{}
		r.lat[k] = l
	}
	return l
}

// ReplyLatency is target k's reply latency, false before its first
// request/response session.
func (r *Relay) ReplyLatency(k TargetKey) (ReplyLatency, bool) {
	r.amu.Lock()
	l := r.lat[k]
	r.amu.Unlock()
	if l == nil {
		return ReplyLatency{}, false
	}
	return l.snapshot(), true
}

// stats is the session's record for its End: the client leg's bytes sent
// are the replies', the target leg's the client's datagrams'.
func (s *session) stats() proxy.ConnStats {
	st := proxy.ConnStats{ID: s.id, Client: s.key.client, VIP: s.key.vip, Service: s.vs.Name, Start: s.start}
	if s.dec.Target != nil {
		st.Target = s.dec.Target.Name
	}
	if s.dec.Action != nil {
		st.Action = s.dec.Action.Name
	}
	st.ClientLeg.BytesReceived, st.ClientLeg.SegmentsReceived = s.bytesIn.Load(), s.dgIn.Load()
	st.ClientLeg.BytesSent, st.ClientLeg.SegmentsSent = s.bytesOut.Load(), s.dgOut.Load()
	st.TargetLeg.BytesSent, st.TargetLeg.SegmentsSent = s.bytesIn.Load(), s.dgIn.Load()
	st.TargetLeg.BytesReceived, st.TargetLeg.SegmentsReceived = s.bytesOut.Load(), s.dgOut.Load()
	return st
}

// Sweep ends the sessions idle past their timeout at now and returns the
// earliest deadline left (zero time: none). Run calls it; a test calls it
// on its own clock.
func (r *Relay) Sweep(now time.Time) time.Time {
	t := now.UnixNano()
	type due struct {
		s   *session
		why endReason
	}
	var ending []due
	r.mu.Lock()
	for len(r.exp) > 0 && r.exp[0].deadline <= t {
		s := r.exp[0]
		real, why := s.due()
		if real > t {
			s.deadline = real
			heap.Fix(&r.exp, 0)
			continue
		}
		heap.Pop(&r.exp)
		ending = append(ending, due{s, why})
	}
	var next time.Time
	if len(r.exp) > 0 {
		next = time.Unix(0, r.exp[0].deadline)
	}
	r.mu.Unlock()
	for _, d := range ending {
		r.end(d.s, d.why, nil)
	}
	return next
}

// due is when s ends if nothing else happens, and why: its idle timeout
// after its last datagram or, for a request/response session with no reply
// yet, its response timeout after its first datagram.
func (s *session) due() (int64, endReason) {
	idle := s.last.Load() + s.idle
	if s.replies > 0 && s.got.Load() == 0 {
		if a := s.start.UnixNano() + s.answer; a <= idle {
			return a, endUnanswered
		}
	}
	return idle, endIdle
}

// Run sweeps idle sessions, on a timer at the earliest deadline, until
// stop is closed.
func (r *Relay) Run(stop <-chan struct{}) {
	const most = time.Second // the longest wait: a clock step is caught within it
	t := time.NewTimer(most)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-r.wake:
		case <-t.C:
		}
		now := r.now()
		wait := most
		if next := r.Sweep(now); !next.IsZero() {
			wait = min(max(next.Sub(now), time.Millisecond), most)
		}
		if !t.Stop() {
			select {
			case <-t.C:
			default:
			}
		}
		t.Reset(wait)
	}
}

// Close ends every session (Aborted) and waits for their goroutines; later
// datagrams are dropped.
func (r *Relay) Close() {
	r.mu.Lock()
	r.closed = true
	all := make([]*session, 0, len(r.table))
	for _, s := range r.table {
		all = append(all, s)
	}
	r.mu.Unlock()
	for _, s := range all {
		r.end(s, endClosed, nil)
	}
	r.wg.Wait()
}

// Stats returns the relay's counters.
func (r *Relay) Stats() Stats {
	return Stats{
		Sessions: r.open.Load(), Created: r.created.Load(), Refused: r.refused.Load(),
		DroppedFull: r.droppedFull.Load(), DroppedVIP: r.droppedVIP.Load(), DialFailed: r.dialFailed.Load(),
		EndedIdle: r.endedIdle.Load(), EndedResponses: r.endedResponses.Load(), EndedUnanswered: r.endedUnanswered.Load(), EndedError: r.endedError.Load(),
		EndedClosed: r.endedClosed.Load(),
		DatagramsIn: r.dgIn.Load(), DatagramsOut: r.dgOut.Load(), BytesIn: r.bytesIn.Load(), BytesOut: r.bytesOut.Load(),
		WriteErrors: r.writeErrors.Load(),
	}
}

// isClosed reports an error of a socket closed under its reader or writer.
func isClosed(err error) bool { return errors.Is(err, net.ErrClosed) }

// expiry is a min-heap of sessions by deadline (container/heap).
type expiry []*session

func (e expiry) Len() int           { return len(e) }
func (e expiry) Less(i, j int) bool { return e[i].deadline < e[j].deadline }
func (e expiry) Swap(i, j int) {
	e[i], e[j] = e[j], e[i]
	e[i].idx, e[j].idx = i, j
}
func (e *expiry) Push(x any) {
	s := x.(*session)
	s.idx = len(*e)
	*e = append(*e, s)
}
func (e *expiry) Pop() any {
	old := *e
	s := old[len(old)-1]
	old[len(old)-1] = nil
	s.idx = -1
	*e = old[:len(old)-1]
	return s
}
