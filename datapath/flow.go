package datapath

// Flow table flow
//
//	key (server side: VIP:port, client:port, proto) ─► hash ─► shard = hash & (shards-1)
//	Lookup: load the shard's slot array (atomic) ─► linear probe of atomic
//	        pointers to immutable *Flow ─► compare key ─► hit, or miss at an
//	        empty slot. No lock, no write except a coarse last-seen stamp.
//	Insert: lock the shard's writer mutex ─► probe ─► replace, reuse a
//	        tombstone or take the empty slot; a full shard first expires idle
//	        flows, then evicts a half-open one, then refuses (counted).
//
// Half-open flows: a TCP flow to a virtual server starts half-open (a SYN,
// or any first packet: a spoofed ACK too) and is confirmed by the client's
// next packet that carries ACK without SYN or RST (the handshake's ACK).
// Until then it expires within timeouts.handshake of when it was made (the
// sweep after three quarters of it), not after the idle timeout, and a full shard evicts it to make room: a flood of
// spoofed SYNs neither fills the table for minutes nor keeps real clients'
// flows out of it.
//
// Concurrency: a Flow is immutable once published except its last-seen time
// and bound target, which are atomics. Slots are atomic pointers, so a
// reader probing while a writer inserts or tombstones sees either the old or
// the new pointer, and always compares the key of the entry it loaded: it
// can miss a flow being inserted, never return a wrong one. When tombstones
// pile up a writer rebuilds the shard into a fresh array and publishes it
// atomically; the old array stays whole, so a reader on it sees every flow
// of before the rebuild, and a reader that missed there while a newer
// array was published probes the newer one. Writers of one shard serialise
// on its mutex; that lock is taken once per new flow, never per packet, and
// shards are many so that two workers creating flows rarely meet on one.

import (
	"encoding/binary"
	"math/bits"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"weir/policy"
)

// FlowKey identifies a flow from the server side, as policy rules see it:
// Server is the virtual server's address and port (the destination of an
// ingress packet, the source of an egress one), Client the peer's. IPv4
// addresses are stored IPv4-mapped. The zero FlowKey is valid and unused.
type FlowKey struct {
	Server, Client         [16]byte
	ServerPort, ClientPort uint16
	Proto                  uint8
}

// NewFlowKey returns the key of the flow between client and server (a VIP
// and port) with IP protocol proto: the key the engine gives that flow's
// packets in both directions.
func NewFlowKey(client, server netip.AddrPort, proto uint8) FlowKey {
	return FlowKey{Server: server.Addr().As16(), Client: client.Addr().As16(), ServerPort: server.Port(), ClientPort: client.Port(), Proto: proto}
}

// ingressKeyInto writes the key of p, a packet travelling client → server,
// into k.
func (p *Packet) ingressKeyInto(k *FlowKey) {
	k.Server, k.Client, k.ServerPort, k.ClientPort, k.Proto = p.Dst, p.Src, p.DstPort, p.SrcPort, p.Proto
}

// egressKeyInto writes the key of p, a packet travelling server → client,
// into k.
func (p *Packet) egressKeyInto(k *FlowKey) {
	k.Server, k.Client, k.ServerPort, k.ClientPort, k.Proto = p.Src, p.Dst, p.SrcPort, p.DstPort, p.Proto
}

// ServerAddrPort returns the server side as an address and port.
func (k *FlowKey) ServerAddrPort() netip.AddrPort {
	return netip.AddrPortFrom(addrFrom16(k.Server), k.ServerPort)
}

// ClientAddrPort returns the client side as an address and port.
func (k *FlowKey) ClientAddrPort() netip.AddrPort {
	return netip.AddrPortFrom(addrFrom16(k.Client), k.ClientPort)
}

// Hash returns the key's 64-bit hash: the addresses and ports folded into
// two words mixed by one 64×64→128-bit multiply (wyhash's mum). It is weir's
// one flow hash: the flow table shards and probes by it, and the balancer's
// Maglev maps it to a target. It is not keyed and depends on nothing but
// the key, so every weir instance (behind ECMP, after a restart) computes
// the same hash for a flow and Maglev sends it to the same target;
// TestFlowHashStable pins its values, and changing it moves flows between
// targets across an upgrade. The per-shard bound limits what a crafted
// collision set can cost.
func (k *FlowKey) Hash() uint64 {
	le := binary.LittleEndian
	x := le.Uint64(k.Server[0:8]) ^ bits.RotateLeft64(le.Uint64(k.Server[8:16]), 29) ^
		(uint64(k.ServerPort)<<24 | uint64(k.ClientPort)<<8 | uint64(k.Proto))
	y := le.Uint64(k.Client[0:8]) ^ bits.RotateLeft64(le.Uint64(k.Client[8:16]), 43)
	hi, lo := bits.Mul64(x^0xa0761d6478bd642f, y^0xe7037ed1a0b428db)
	return hi ^ lo
}

// equal is k == *o, compared a word at a time.
func (k *FlowKey) equal(o *FlowKey) bool {
	le := binary.LittleEndian
	return le.Uint64(k.Server[0:8]) == le.Uint64(o.Server[0:8]) &&
		le.Uint64(k.Server[8:16]) == le.Uint64(o.Server[8:16]) &&
		le.Uint64(k.Client[0:8]) == le.Uint64(o.Client[0:8]) &&
		le.Uint64(k.Client[8:16]) == le.Uint64(o.Client[8:16]) &&
		k.ServerPort == o.ServerPort && k.ClientPort == o.ClientPort && k.Proto == o.Proto
}

// NoTarget is a Flow's target before the balancer binds one.
const NoTarget = -1

// Flow is what is decided once per flow. The exported fields are set before
// the flow is inserted and never change; a new decision (a config swap)
// replaces the whole Flow. Read them freely from any goroutine.
type Flow struct {
	// The fields a lookup reads fill the first 64 bytes, and the Flow is
	// padded to 128 so that the allocator aligns it on a cache line: a
	// lookup touches one line. The pointers, read only by control-plane
	// callers, come after.

	tag uint32 // the low half of Key.Hash(), set by Insert before publication
	Key FlowKey
	// TOS is written on every packet toward the client when SetTOS is set.
	TOS    uint8
	SetTOS bool
	// Row is the flow's meter row: its (service, action) pair; see
	// Meters.Row.
	Row    int32
	target atomic.Int32 // NoTarget or the caller's target index
	// Gen is the config generation the decision was made under.
	Gen      uint32
	lastSeen atomic.Int64 // monotonic ns, coarse: see FlowTable

	// Service is the virtual server the flow arrived at, or nil.
	Service *policy.VirtualServer
	// Action is the first matching policy rule's action, or nil.
	Action *policy.Action
	// seg is the passive TCP measurement of a back-leg flow, nil for
	// others; set before publication, carried over when the Flow is
	// replaced.
	seg *SegStats
	// as is the client a PROXY-protocol header named for the connection
	// (Engine.Reclassify), whose rule the flow follows; nil: the key's
	// client. Set before publication, carried over when the Flow is
	// replaced (a config swap decides the flow for it again).
	as *netip.AddrPort
	// app is the sequence-space state of the application byte count, by
	// Dir (appspace.go); carried over when the Flow is replaced.
	app [2]appSpace
	// born is when the flow was inserted (monotonic ns), for a half-open
	// flow's handshake timeout.
	born int64
	// half is set while the flow is half-open (see the file comment);
	// cleared once, by confirmation or removal, with a CAS.
	half atomic.Bool

	_ [4]byte // to 128 bytes: a size class the allocator aligns to 128
}

// HalfOpen reports whether the flow is a TCP handshake not yet confirmed
// by the client's ACK.
func (f *Flow) HalfOpen() bool { return f.half.Load() }

// Seg returns the flow's passive TCP measurement (see SegStats), or nil
// for a flow that is not a back leg.
func (f *Flow) Seg() *SegStats { return f.seg }

// Target returns the target index bound with Bind, or NoTarget.
func (f *Flow) Target() int { return int(f.target.Load()) }

// Bind records the caller's target index for the flow (the balancer's
// choice); the meters then count the flow's packets for that target too.
func (f *Flow) Bind(target int) { f.target.Store(int32(target)) }

// FlowTableOptions configure NewFlowTable. The zero value works.
type FlowTableOptions struct {
	// MaxFlows bounds the number of flows; zero means 65536. The bound is
	// split evenly over the shards, and a full shard refuses new flows.
	MaxFlows int
	// IdleTimeout is how long a flow with no packet stays; zero means
	// 5 minutes.
	IdleTimeout time.Duration
	// Shards is the number of independently locked shards, rounded up to
	// a power of two; zero means 64.
	Shards int
	// HandshakeTimeout is how long a half-open flow of a virtual server
	// whose Timeouts.Handshake is zero stays; zero means
	// policy.DefaultHandshakeTimeout.
	HandshakeTimeout time.Duration
}

// FlowTableStats are the table's counters, totals since creation.
type FlowTableStats struct {
	Flows    int    // live flows now, including idle ones not yet swept
	Inserted uint64 // flows created
	Replaced uint64 // decisions replaced (a config swap reclassified)
	Expired  uint64 // flows removed after IdleTimeout, or half-open ones after their handshake timeout
	Refused  uint64 // flows not created because their shard was full of confirmed flows
	// HalfOpen is the live flows still half-open now; Evicted counts
	// half-open flows a full shard removed to make room for a new flow.
	HalfOpen int
	Evicted  uint64
}

// FlowTable maps FlowKeys to Flows; see the file comment for its
// concurrency. Times are int64 nanoseconds from the caller's monotonic
// clock.
type FlowTable struct {
	shards    []flowShard
	shardMask uint64
	idle      int64 // ns
	stamp     int64 // ns: last-seen is rewritten only when this stale
	handshake int64 // ns: FlowTableOptions.HandshakeTimeout
	rescan    int64 // ns: a full shard's insert scans it for expired flows at most this often

	inserted, replaced, expired, refused, evicted atomic.Uint64
	sweep                                         atomic.Uint64 // next shard ExpireStep sweeps
}

type flowShard struct {
	slots atomic.Pointer[[]atomic.Pointer[Flow]] // read by every lookup
	_     [56]byte                               // so writers' state below does not share its line

	mu   sync.Mutex   // serialises writers of this shard
	live atomic.Int64 // written under mu, read by room without it
	half atomic.Int64 // of live, the half-open flows (confirm decrements it without mu)
	tomb int          // guarded by mu
	hand int          // guarded by mu: where evictHalfOpen looks next
	max  int64
	// swept is when expireShard last scanned the shard (guarded by mu): a
	// full shard's insert rescans it at most every rescan, not per flow.
	swept int64

	_ [64]byte // keep neighbouring shards' writer state off one cache line
}

// tombstone marks a removed slot so that probe chains through it stay
// intact.
var tombstone = &Flow{}

// NewFlowTable returns an empty table.
func NewFlowTable(o FlowTableOptions) *FlowTable {
	if o.MaxFlows <= 0 {
		o.MaxFlows = 65536
	}
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = 5 * time.Minute
	}
	if o.Shards <= 0 {
		o.Shards = 64
	}
	if o.HandshakeTimeout <= 0 {
		o.HandshakeTimeout = policy.DefaultHandshakeTimeout
	}
	n := 1
	for n < o.Shards {
		n <<= 1
	}
	per := (o.MaxFlows + n - 1) / n
	size := 8
	for size < 2*per {
		size <<= 1
	}
	t := &FlowTable{shards: make([]flowShard, n), shardMask: uint64(n - 1), idle: int64(o.IdleTimeout), handshake: int64(o.HandshakeTimeout)}
	t.stamp = t.idle / 16
	if t.stamp > int64(time.Second) {
		t.stamp = int64(time.Second)
	}
	t.rescan = min(t.stamp, t.handshake/16)
	for i := range t.shards {
		s := &t.shards[i]
		s.max = int64(per)
		slots := make([]atomic.Pointer[Flow], size)
		s.slots.Store(&slots)
	}
	return t
}

func (t *FlowTable) shard(h uint64) *flowShard { return &t.shards[h&t.shardMask] }

// Lookup returns the live flow for k, whose hash is h, or nil. A flow idle
// for longer than IdleTimeout counts as absent. A hit refreshes the flow's
// last-seen time. It takes no lock and does not allocate.
func (t *FlowTable) Lookup(k *FlowKey, h uint64, now int64) *Flow {
	s := t.shard(h)
	arr := s.slots.Load()
	for try := 0; try < 3; try++ {
		if f := probe(*arr, k, h); f != nil {
			last := f.lastSeen.Load()
			if now-last > t.idle {
				return nil
			}
			if now-last >= t.stamp {
				f.lastSeen.Store(now)
			}
			return f
		}
		// A miss in an array a rebuild has since replaced may be a flow
		// inserted into the new one: probe that.
		next := s.slots.Load()
		if next == arr {
			return nil
		}
		arr = next
	}
	return nil
}

// probe returns the flow with key k in slots, or nil.
func probe(slots []atomic.Pointer[Flow], k *FlowKey, h uint64) *Flow {
	mask := uint64(len(slots) - 1)
	i := (h >> 32) & mask
	for range slots {
		f := slots[i].Load()
		if f == nil {
			return nil
		}
		if f.tag == uint32(h) && f != tombstone && f.Key.equal(k) {
			return f
		}
		i = (i + 1) & mask
	}
	return nil
}

// room reports, without locking, whether h's shard can take a flow: it is
// below its bound or holds a half-open flow to evict. When it cannot, the
// flow is refused and counted. A full shard may still take a flow after
// Expire or an Insert that sweeps.
func (t *FlowTable) room(h uint64) bool {
	s := t.shard(h)
	if s.live.Load() < s.max || s.half.Load() > 0 {
		return true
	}
	t.refused.Add(1)
	return false
}

// confirm ends f's half-open state: the client's ACK came. Lock-free.
func (t *FlowTable) confirm(f *Flow) {
	if f.half.CompareAndSwap(true, false) {
		t.shard(uint64(f.tag)).half.Add(-1)
	}
}

// unhalf clears the half-open state of f, a flow leaving shard s.
func (s *flowShard) unhalf(f *Flow) {
	if f.half.CompareAndSwap(true, false) {
		s.half.Add(-1)
	}
}

// handshakeOf is how long f may stay half-open: its service's handshake
// timeout, or the table's.
func (t *FlowTable) handshakeOf(f *Flow) int64 {
	if f.Service != nil && f.Service.Timeouts.Handshake > 0 {
		return int64(f.Service.Timeouts.Handshake)
	}
	return t.handshake
}

// Insert publishes f (whose exported fields are final) under f.Key with
// hash h, replacing any flow with the same key, and returns f; its
// last-seen time is set to now and its target to NoTarget. A full shard
// first drops its idle flows, then evicts a half-open one; if it is still
// full, Insert refuses, counts it and returns nil. It locks f's shard.
// The flow is confirmed (not half-open) unless the engine marked it.
func (t *FlowTable) Insert(f *Flow, h uint64, now int64) *Flow {
	return t.insert(f, h, now, NoTarget)
}

// insert is Insert with the flow's initial target.
func (t *FlowTable) insert(f *Flow, h uint64, now int64, target int32) *Flow {
	f.tag = uint32(h)
	f.lastSeen.Store(now)
	f.born = now
	f.target.Store(target)
	s := t.shard(h)
	s.mu.Lock()
	defer s.mu.Unlock()
	for expired := false; ; expired = true {
		slots := *s.slots.Load()
		mask := uint64(len(slots) - 1)
		i := (h >> 32) & mask
		free := -1
		for range slots {
			old := slots[i].Load()
			if old == nil {
				break
			}
			if old == tombstone {
				if free < 0 {
					free = int(i)
				}
			} else if old.tag == uint32(h) && old.Key.equal(&f.Key) {
				if f.half.Load() {
					s.half.Add(1)
				}
				slots[i].Store(f)
				s.unhalf(old)
				t.replaced.Add(1)
				return f
			}
			i = (i + 1) & mask
		}
		if s.live.Load() >= s.max {
			// A flood keeps the shard full: scanning all of it for each
			// new flow cost a scan per SYN. Scan at most every rescan
			// (the engine's sweep covers the rest); evict in between.
			if expired || !t.makeRoom(s, now) {
				t.refused.Add(1)
				return nil
			}
			continue // expiry may have rebuilt the shard: probe again
		}
		if f.half.Load() {
			s.half.Add(1)
		}
		if free >= 0 {
			slots[free].Store(f)
			s.tomb--
		} else {
			slots[i].Store(f)
		}
		s.live.Add(1)
		t.inserted.Add(1)
		return f
	}
}

// Expire removes every flow idle for longer than IdleTimeout at now and
// returns how many it removed. Lookup already ignores such flows; Expire
// frees their slots. It locks each shard in turn.
func (t *FlowTable) Expire(now int64) int {
	n := 0
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		n += t.expireShard(s, now)
		s.mu.Unlock()
	}
	return n
}

// ExpireStep sweeps the next shard in turn, as Expire does for all, and
// returns how many flows it removed: Shards calls make one whole pass.
// The engine calls it from its packet path, so each call costs one
// shard's scan rather than the whole table's.
func (t *FlowTable) ExpireStep(now int64) int {
	s := &t.shards[(t.sweep.Add(1)-1)&t.shardMask]
	s.mu.Lock()
	defer s.mu.Unlock()
	return t.expireShard(s, now)
}

// Shards returns the number of shards.
func (t *FlowTable) Shards() int { return len(t.shards) }

// expireShard tombstones s's idle flows, and its half-open flows past
// their handshake timeout, and rebuilds s when tombstones fill a quarter
// of it. s.mu is held.
func (t *FlowTable) expireShard(s *flowShard, now int64) int {
	s.swept = now
	slots := *s.slots.Load()
	n := 0
	for i := range slots {
		f := slots[i].Load()
		if f == nil || f == tombstone {
			continue
		}
		// A shard is swept at least every quarter of the shortest
		// handshake timeout (Engine.sweepEvery): past three quarters
		// of its own, a half-open flow would outlive it before the next
		// sweep.
		if now-f.lastSeen.Load() > t.idle || f.half.Load() && now-f.born > t.handshakeOf(f)/4*3 {
			slots[i].Store(tombstone)
			s.unhalf(f)
			n++
		}
	}
	s.live.Add(-int64(n))
	s.tomb += n
	t.expired.Add(uint64(n))
	t.maybeRebuild(s, slots)
	return n
}

// makeRoom frees a slot of the full shard s for an insert: its expired
// flows (scanned at most every rescan), else a half-open flow, else, if
// the scan was skipped, its expired flows after all. s.mu is held.
func (t *FlowTable) makeRoom(s *flowShard, now int64) bool {
	scan := now-s.swept >= t.rescan
	if scan && t.expireShard(s, now) > 0 || t.evictHalfOpen(s) {
		return true
	}
	return !scan && t.expireShard(s, now) > 0
}

// evictHalfOpen tombstones one half-open flow of s, the next from where
// the last eviction stopped (so evictions go round the shard, oldest
// first in effect, at a cost of about one slot each during a flood), and
// reports whether it found one. s.mu is held.
func (t *FlowTable) evictHalfOpen(s *flowShard) bool {
	if s.half.Load() <= 0 {
		return false
	}
	slots := *s.slots.Load()
	mask := len(slots) - 1
	for range slots {
		i := s.hand & mask
		s.hand++
		f := slots[i].Load()
		if f == nil || f == tombstone || !f.half.Load() {
			continue
		}
		slots[i].Store(tombstone)
		s.unhalf(f)
		s.live.Add(-1)
		s.tomb++
		t.evicted.Add(1)
		t.maybeRebuild(s, slots)
		return true
	}
	return false
}

// maybeRebuild rebuilds s when tombstones fill a quarter of slots, or
// tombstones and live flows three quarters. s.mu is held.
func (t *FlowTable) maybeRebuild(s *flowShard, slots []atomic.Pointer[Flow]) {
	if s.tomb > 0 && (int(s.live.Load())+s.tomb)*4 > len(slots)*3 || s.tomb*4 > len(slots) {
		t.rebuild(s, slots)
	}
}

// rebuild copies s's live flows into a fresh array without tombstones and
// publishes it. s.mu is held.
func (t *FlowTable) rebuild(s *flowShard, old []atomic.Pointer[Flow]) {
	fresh := make([]atomic.Pointer[Flow], len(old))
	mask := uint64(len(fresh) - 1)
	for i := range old {
		f := old[i].Load()
		if f == nil || f == tombstone {
			continue
		}
		j := (f.Key.Hash() >> 32) & mask
		for fresh[j].Load() != nil {
			j = (j + 1) & mask
		}
		fresh[j].Store(f)
	}
	s.slots.Store(&fresh)
	s.tomb = 0
}

// Stats returns the table's counters.
func (t *FlowTable) Stats() FlowTableStats {
	st := FlowTableStats{
		Inserted: t.inserted.Load(),
		Replaced: t.replaced.Load(),
		Expired:  t.expired.Load(),
		Refused:  t.refused.Load(),
		Evicted:  t.evicted.Load(),
	}
	for i := range t.shards {
		st.Flows += int(t.shards[i].live.Load())
		st.HalfOpen += int(t.shards[i].half.Load())
	}
	return st
}
