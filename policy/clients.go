package policy

import (
	"math"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// Per-client limits (Traefik #5999, HAProxy's stick tables).
//
// A scope, a virtual server or the instance, with ClientLimits keeps one
// table of clients: an entry per client address, or per prefix of
// ClientLimits.PrefixV4/PrefixV6 bits, with its open connections (for an
// http service: requests in flight), its bandwidth window and its queue.
// Admission checks the virtual server's client first, then the instance's
// client, then the levels (virtual server, classes, instance): a client's
// limit names the client, "client 198.18.5.1: maxConnections 2 reached (2
// open)".
//
// The table is bounded: at TableSize entries a new client takes the place
// of the least recently used idle one (no connection open, nobody queued:
// its bandwidth history goes with it), and when every entry is busy the
// new client is admitted without a client limit and counted as overflow
// (ClientStat.Overflow, weir_client_table_overflow_total): the bound is
// memory, not a limit that refuses. Exact per instance. In a cluster each
// instance keeps its own table, and an enforced maxConnections is also
// asked of the ClientArbiter (SetClientArbiter): the client's count at
// the other members plus its count here must stay within the limit.
//
// A client's bandwidth follows the levels' window semantics, bytes in the
// last metricInterval divided by metricInterval, with a coarser ring (a
// level has one slot per recomputeInterval, a client ClientSlots slots of
// metricInterval/ClientSlots) so that an entry stays small; the slots are
// stamped with the time of the last Recompute, so the rate moves at
// recompute steps, and it is read when the client connects, not
// recomputed in the background. Bytes count as the proxy moves them (an
// http request's, a tcp connection's payload); like the levels, a client
// over an enforced maxBandwidth gets no new connection, and one over a
// logged limit is logged once until it is back under.

// ClientSlots is the number of slots of a client's bandwidth window.
const ClientSlots = 30

// DefaultClientTableSize is ClientLimits.TableSize when unset.
const DefaultClientTableSize = 100_000

// MaxClientTableSize bounds ClientLimits.TableSize.
const MaxClientTableSize = 1 << 24

// ClientLimits are the limits each client of a scope (a virtual server, or
// the instance) gets on its own.
type ClientLimits struct {
	// Limits are the per-client values: MaxConnections (http: requests in
	// flight) and MaxBandwidth with their enforce flags, Queue and
	// QueueTimeout. BurstBytes is not used.
	Limits
	// PrefixV4 and PrefixV6 group clients by prefix: 24 makes a /24 one
	// client. 0 means 32 and 128 (each address its own).
	PrefixV4, PrefixV6 int
	// TableSize bounds the clients kept; 0 means DefaultClientTableSize.
	TableSize int
}

// Any reports whether a per-client limit is set.
func (c ClientLimits) Any() bool { return c.MaxConnections > 0 || c.MaxBandwidth > 0 }

func (c *ClientLimits) size() int {
	if c.TableSize > 0 {
		return c.TableSize
	}
	return DefaultClientTableSize
}

// key is a client's table key: its address masked to the prefix, as 16
// bytes (an IPv4 address in its v4-mapped form).
func (c *ClientLimits) key(a netip.Addr) (netip.Prefix, [16]byte) {
	a = a.Unmap()
	bits := c.PrefixV6
	if a.Is4() {
		bits = c.PrefixV4
		if bits <= 0 || bits > 32 {
			bits = 32
		}
	} else if bits <= 0 || bits > 128 {
		bits = 128
	}
	p, _ := a.Prefix(bits)
	k := p.Addr().As16()
	if a.Is4() {
		k[0] = 4 // tell 1.2.3.4 from ::ffff:1.2.3.4's 16 bytes (Unmap made them one)
	}
	return p, k
}

// prefixOf is the client prefix of a table key (key's inverse).
func (c *ClientLimits) prefixOf(k [16]byte) netip.Prefix {
	if k[0] == 4 && k[10] == 0xff && k[11] == 0xff && [9]byte(k[1:10]) == [9]byte{} {
		k[0] = 0 // an IPv4 address's key
	}
	p, _ := c.key(netip.AddrFrom16(k))
	return p
}

// clientTable is one scope's clients.
type clientTable struct {
	a     *Admission
	scope string // the virtual server's name, "" for the instance
	lim   atomic.Pointer[ClientLimits]
	slot  atomic.Int64 // metricInterval/ClientSlots, ns

	mu   sync.Mutex
	m    map[[16]byte]*clientEntry // by mu
	lru  clientEntry               // by mu: the idle entries' ring, most recent first
	busy int                       // by mu: entries with connections or waiters

	overflow, evicted atomic.Uint64
	refused           atomic.Uint64
	qc                queueCounters
}

// clientEntry is one client. Its fields are the table's mutex's, except
// the window (atomic).
type clientEntry struct {
	prev, next *clientEntry // the idle ring; nil while busy
	q          *waitQueue   // created on the first refusal with a queue
	ring       atomic.Pointer[clientRing]
	conns      int32
	logged     bool // a logged limit's excess was reported
	key        [16]byte
}

// clientRing is a client's bandwidth window: per slot, the slot's number
// (high 32 bits) and its bytes (low 32 bits, saturating).
type clientRing [ClientSlots]atomic.Uint64

func newClientTable(a *Admission, scope string) *clientTable {
	t := &clientTable{a: a, scope: scope, m: make(map[[16]byte]*clientEntry)}
	t.lru.prev, t.lru.next = &t.lru, &t.lru
	return t
}

// apply sets the table's limits (under Admission.mu).
func (t *clientTable) apply(cl ClientLimits, metric time.Duration) {
	c := cl
	t.lim.Store(&c)
	t.slot.Store(int64(max(metric/ClientSlots, time.Millisecond)))
}

func (t *clientTable) unlinkIdle(e *clientEntry) {
	if e.next != nil {
		e.prev.next, e.next.prev = e.next, e.prev
		e.prev, e.next = nil, nil
		t.busy++
	}
}

func (t *clientTable) pushIdle(e *clientEntry) {
	if e.next == nil {
		e.next, e.prev = t.lru.next, &t.lru
		t.lru.next.prev = e
		t.lru.next = e
		t.busy--
	}
}

// slotNow is the current window slot: the last Recompute's time (the wall
// clock before the first: bytes moved then count from then on).
func (t *clientTable) slotNow() int64 {
	ns := t.a.now.Load()
	if ns == 0 {
		ns = time.Now().UnixNano()
	}
	return ns / t.slot.Load()
}

// rate is e's bytes per second over the metric interval as of slot cur.
func (e *clientEntry) rate(cur int64, slot int64) int64 {
	r := e.ring.Load()
	if r == nil {
		return 0
	}
	var sum uint64
	for i := range r {
		v := r[i].Load()
		if s := int64(v >> 32); s <= cur&math.MaxUint32 && s > cur&math.MaxUint32-ClientSlots {
			sum += v & math.MaxUint32
		}
	}
	return int64(sum * uint64(time.Second) / uint64(slot*ClientSlots))
}

// addBytes counts n bytes in e's window at slot cur.
func (e *clientEntry) addBytes(cur int64, n uint64) {
	r := e.ring.Load()
	if r == nil {
		return
	}
	b := &r[cur%ClientSlots]
	stamp := uint64(cur&math.MaxUint32) << 32
	for {
		v := b.Load()
		nv := stamp | min(n, math.MaxUint32)
		if v&^math.MaxUint32 == stamp {
			nv = stamp | min(v&math.MaxUint32+n, math.MaxUint32)
		}
		if b.CompareAndSwap(v, nv) {
			return
		}
	}
}

// acquire counts a connection of client at t, or refuses it. head is the
// queue the caller heads (it may take a slot past the others waiting). It
// returns the entry the connection holds (nil when the table overflowed:
// admitted without a client limit) and, when a ClientArbiter is set and
// the connection limit is enforced, what to ask it (ask.n > 0).
func (t *clientTable) acquire(client netip.Addr, head *waitQueue, r *Refusal) (*clientEntry, clientAsk, bool) {
	lim := t.lim.Load()
	p, key := lim.key(client)
	t.mu.Lock()
	e := t.m[key]
	if e == nil {
		if len(t.m) >= lim.size() {
			old := t.lru.prev
			if old == &t.lru {
				t.mu.Unlock()
				t.overflow.Add(1)
				return nil, clientAsk{}, true
			}
			t.unlinkIdle(old)
			t.busy--
			delete(t.m, old.key)
			t.evicted.Add(1)
		}
		e = &clientEntry{key: key}
		t.m[key] = e
		t.busy++ // not on the idle ring yet
	}
	if lim.MaxBandwidth > 0 && e.ring.Load() == nil {
		e.ring.Store(new(clientRing))
	}
	over := func(k LimitKind, value, measured int64) {
		r.Over = Over{Level: LevelClient, Name: clientName(p), Limit: k, Value: value, Measured: measured}
	}
	refuse := func() (*clientEntry, clientAsk, bool) {
		if e.conns == 0 && (e.q == nil || e.q.n.Load() == 0) {
			t.pushIdle(e)
		}
		t.mu.Unlock()
		t.refused.Add(1)
		return nil, clientAsk{}, false
	}
	var logOver []Event
	if lim.MaxBandwidth > 0 {
		rate := e.rate(t.slotNow(), t.slot.Load())
		if rate >= lim.MaxBandwidth && lim.EnforceBandwidth {
			over(LimitMaxBandwidth, lim.MaxBandwidth, rate)
			return refuse()
		}
		if rate > lim.MaxBandwidth && !e.logged {
			e.logged = true
			logOver = append(logOver, Event{Level: LevelClient, Name: clientName(p), Limit: LimitMaxBandwidth,
				Value: lim.MaxBandwidth, Measured: rate, Over: true})
		}
	}
	if lim.MaxConnections > 0 && lim.EnforceConnections {
		n := int64(e.conns)
		queued := lim.queued() && e.q != nil && e.q.n.Load() > 0 && e.q != head
		if n >= lim.MaxConnections || queued {
			over(LimitMaxConnections, lim.MaxConnections, n)
			if lim.queued() {
				if e.q == nil {
					e.q = &waitQueue{c: &t.qc}
				}
				r.q, r.qmax, r.qtimeout = e.q, lim.Queue, lim.queueTimeout()
				r.qwaiting = e.q.n.Load()
			}
			return refuse()
		}
	} else if lim.MaxConnections > 0 && int64(e.conns)+1 > lim.MaxConnections && !e.logged {
		e.logged = true
		logOver = append(logOver, Event{Level: LevelClient, Name: clientName(p), Limit: LimitMaxConnections,
			Value: lim.MaxConnections, Measured: int64(e.conns) + 1, Over: true})
	}
	if e.conns == 0 {
		t.unlinkIdle(e)
	}
	e.conns++
	if lim.MaxConnections > 0 && int64(e.conns) < lim.MaxConnections && lim.MaxBandwidth == 0 {
		e.logged = false
	}
	var ask clientAsk
	if lim.MaxConnections > 0 && lim.EnforceConnections && t.a.arbiter() != nil {
		// The count and its order are taken together, under mu: the
		// arbiter records the latest of them.
		ask = clientAsk{name: clientName(p), n: int64(e.conns), seq: t.a.clientSeq.Add(1), limit: lim.MaxConnections}
	}
	t.mu.Unlock()
	for _, ev := range logOver {
		ev.At = t.a.lastRecompute()
		t.a.emit(ev)
	}
	return e, ask, true
}

// clientAsk is what a client table's admission asks the ClientArbiter.
type clientAsk struct {
	name          string // the client, as a refusal names it
	n, seq, limit int64
}

// release uncounts one connection of e and wakes its queue's head; with a
// ClientArbiter set, tells it the client's count changed.
func (t *clientTable) release(e *clientEntry) {
	t.mu.Lock()
	e.conns--
	q := e.q
	if e.conns <= 0 && (q == nil || q.n.Load() == 0) {
		e.conns = 0
		t.pushIdle(e)
	}
	t.mu.Unlock()
	if arb := t.a.arbiter(); arb != nil {
		if lim := t.lim.Load(); lim.MaxConnections > 0 && lim.EnforceConnections {
			arb.Changed(t.scope, clientName(lim.prefixOf(e.key)))
		}
	}
	if q != nil {
		q.wakeHead()
	}
}

// clientName is the name a refusal gives a client: its address, or its
// prefix when clients are grouped.
func clientName(p netip.Prefix) string {
	if p.Bits() == p.Addr().BitLen() {
		return p.Addr().String()
	}
	return p.String()
}

// ClientStat is one client table's state for the admin API.
type ClientStat struct {
	// Scope is the virtual server's name, "" for the instance's table.
	Scope  string
	Limits ClientLimits
	// Clients is the entries kept, Active those with a connection open or
	// queued, Size the bound.
	Clients, Active, Size int
	// Refused counts the connections refused at a client limit,
	// Overflow the clients admitted without one because every entry was
	// busy, Evicted the idle entries dropped for new clients.
	Refused, Overflow, Evicted uint64
	Queue                      QueueStat
}

func (t *clientTable) stat() ClientStat {
	lim := t.lim.Load()
	t.mu.Lock()
	n, busy := len(t.m), t.busy
	t.mu.Unlock()
	return ClientStat{
		Scope: t.scope, Limits: *lim, Clients: n, Active: busy, Size: lim.size(),
		Refused: t.refused.Load(), Overflow: t.overflow.Load(), Evicted: t.evicted.Load(),
		Queue: t.qc.stat(lim.Limits),
	}
}

// Clients returns the state of every client table: the instance's first,
// then the virtual servers' in config order.
func (a *Admission) Clients() []ClientStat {
	st := a.st.Load()
	var out []ClientStat
	if st.instClients != nil {
		out = append(out, st.instClients.stat())
	}
	for _, c := range st.chains {
		if c.clients != nil {
			out = append(out, c.clients.stat())
		}
	}
	return out
}

// check reports per-client limits out of range.
func (c ClientLimits) check(bad func(string, ...any), where string) {
	c.Limits.check(bad, where)
	if c.BurstBytes != 0 {
		bad("%s: burstBytes is not a per-client limit", where)
	}
	if c.PrefixV4 < 0 || c.PrefixV4 > 32 || c.PrefixV6 < 0 || c.PrefixV6 > 128 {
		bad("%s: clientPrefix %d/%d out of range (ipv4 1..32, ipv6 1..128)", where, c.PrefixV4, c.PrefixV6)
	}
	if c.TableSize < 0 || c.TableSize > MaxClientTableSize {
		bad("%s: tableSize %d out of range 1..%d", where, c.TableSize, MaxClientTableSize)
	}
}

// ClientArbiter shares the per-client connection counts of a cluster's
// members (cmd/weir/internal/cluster implements it over Redis). With one
// set (SetClientArbiter), a connection an enforced per-client
// maxConnections admits here is also asked of the arbiter: the client's
// connections at the other members plus its count here must stay within
// the limit. A client's bandwidth and a limit only logged stay per
// instance.
type ClientArbiter interface {
	// Admit is asked, synchronously and after the client's table here
	// admitted it, for a connection that makes n connections of client
	// (named as a refusal names it) at scope (a virtual server's name, ""
	// the instance's table) here; seq orders this instance's counts of a
	// client, a later count having a larger seq. It reports the client's
	// connections at the other members and whether those plus n stay
	// within limit; others < 0 when the cluster could not be asked and
	// its fallback refuses.
	Admit(scope, client string, n, seq, limit int64) (others int64, ok bool)
	// Changed tells that the client's count at scope changed here
	// without Admit (a connection released): the arbiter records it
	// later, as ClientCount then reads it. It must not block.
	Changed(scope, client string)
}

type arbiterBox struct{ ClientArbiter }

// SetClientArbiter makes the per-client connection limits cluster-wide
// through arb; nil makes them this instance's alone again.
func (a *Admission) SetClientArbiter(arb ClientArbiter) {
	if arb == nil {
		a.arb.Store(nil)
		return
	}
	a.arb.Store(&arbiterBox{arb})
}

func (a *Admission) arbiter() ClientArbiter {
	if b := a.arb.Load(); b != nil {
		return b.ClientArbiter
	}
	return nil
}

// askArbiter asks the arbiter for a connection its client table at scope
// admitted, and fills r when the cluster refuses it.
func (a *Admission) askArbiter(scope string, ask clientAsk, r *Refusal) bool {
	arb := a.arbiter()
	if arb == nil {
		return true
	}
	others, ok := arb.Admit(scope, ask.name, ask.n, ask.seq, ask.limit)
	if ok {
		return true
	}
	measured := others + ask.n - 1
	if others < 0 {
		measured = -1
	}
	r.Over = Over{Level: LevelClient, Name: ask.name, Limit: LimitMaxConnections, Value: ask.limit,
		Measured: measured, ClusterWide: true, Here: ask.n - 1}
	return false
}

// ClientCount returns client's connections at scope (a virtual server's
// name, "" the instance's table) now, with a sequence number larger than
// that of any count read or admitted before: what a ClientArbiter
// records after Changed. An unknown scope or client has 0.
func (a *Admission) ClientCount(scope, client string) (n, seq int64) {
	t := a.clientTable(scope)
	p, err := netip.ParsePrefix(client)
	if err != nil {
		addr, err2 := netip.ParseAddr(client)
		if err2 != nil {
			return 0, a.clientSeq.Add(1)
		}
		p = netip.PrefixFrom(addr, addr.BitLen())
	}
	if t == nil {
		return 0, a.clientSeq.Add(1)
	}
	lim := t.lim.Load()
	_, key := lim.key(p.Addr())
	t.mu.Lock()
	defer t.mu.Unlock()
	if e := t.m[key]; e != nil {
		n = int64(e.conns)
	}
	return n, a.clientSeq.Add(1)
}

// ClientsActive returns the clients with a connection open at scope,
// named as a refusal names them.
func (a *Admission) ClientsActive(scope string) []string {
	t := a.clientTable(scope)
	if t == nil {
		return nil
	}
	lim := t.lim.Load()
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []string
	for k, e := range t.m {
		if e.conns > 0 {
			out = append(out, clientName(lim.prefixOf(k)))
		}
	}
	return out
}

// clientTable is the current config's client table at scope, or nil.
func (a *Admission) clientTable(scope string) *clientTable {
	st := a.st.Load()
	if scope == "" {
		return st.instClients
	}
	if c := st.byName[scope]; c != nil {
		return c.clients
	}
	return nil
}
