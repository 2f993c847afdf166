package datapath

// Engine flow
//
// Ingress (Port.Read: client → stack), per batch read from the inner device:
//
//	clock once ─► state (config, generation, meters) once ─► per packet:
//	  Parse ─► malformed: drop (compact the batch), count by reason
//	        ─► non-first fragment: no ports, meter as no-flow, pass
//	        ─► ingress key ─► same flow as the previous packet: reuse, else
//	           FlowTable.Lookup ─► miss or stale generation:
//	             Config.Service + Config.Classify ─► FlowTable.Insert
//	        ─► meter into the port's shard (a run of packets in one meter row
//	           costs one pair of atomic adds: meterRun)
//
// Egress (Port.Write: stack → client), per batch before the inner Write:
//
//	per packet: Parse ─► malformed: count, pass unchanged
//	  ─► egress key ─► same flow as the previous packet? reuse its verdict
//	  ─► else Lookup (classify on a miss, as above)
//	  ─► meter into the shard picked by the batch's first flow hash
//	  ─► flow's action has SetTOS: SetTOS in place (RFC 1624 checksum)
//
// Every packet toward a client passes through Write, so SYN-ACKs, RSTs and
// retransmissions are marked like the rest. Per packet nothing allocates
// (a new flow allocates its Flow once), nothing takes a lock except the
// flow table's shard lock when a flow is created, nothing logs.
//
// An offload-capable TUN (virtio-net headers, GSO) hands the engine TCP
// super-packets of up to 64 KiB with their virtio-net header before offset
// (see offload.go): one lookup and one ToS rewrite per super-packet, meters
// counting the segments it stands for.

import (
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"weir/policy"
)

// EngineOptions configure NewEngine. The zero value works.
type EngineOptions struct {
	// Flows configures the flow table.
	Flows FlowTableOptions
	// Workers is the number of Ports expected to read concurrently (one
	// per TUN queue or reader goroutine); zero means one. The meters get
	// at least this many shards, and at least GOMAXPROCS, rounded up to a
	// power of two.
	Workers int
	// Now is the clock, read once per batch; nil means time.Now. Tests
	// inject a manual clock to drive flow expiry.
	Now func() time.Time
	// BackPrefixes hold the back arms' own addresses: a TCP flow whose
	// server side (weir's end) lies in one is a back leg (weir ⇄ target),
	// and gets a SegStats that counts its segments in both directions
	// (see seqtrack.go). Nil means no flow is measured that way.
	BackPrefixes []netip.Prefix
	// TargetMinRTO and OwnMinRTO are the smallest RTOs the timeout
	// heuristic assumes for the target's stack and for weir's own; zero
	// means DefaultTargetMinRTO (200 ms) and DefaultOwnMinRTO (20 ms).
	TargetMinRTO, OwnMinRTO time.Duration
}

// EngineStats are the engine's counters, totals since creation.
type EngineStats struct {
	// Dropped counts ingress packets dropped as malformed, by DropReason.
	Dropped [numDropReasons]uint64
	// EgressMalformed counts packets toward clients the parser rejected
	// (or buffers shorter than the write offset); they are passed on
	// unchanged.
	EgressMalformed uint64
	// Fragments counts non-first fragments, which are passed on and
	// metered as no-flow traffic.
	Fragments uint64
	// Marked counts packets whose ToS the engine rewrote.
	Marked uint64
	// Uncached counts packets classified without a flow entry because the
	// flow table refused the flow (FlowTableStats.Refused counts flows).
	Uncached uint64
}

// Engine is the per-packet datapath between a transport and the stack; see
// the file comment for its flow. It is itself a Device (worker 0's Port over
// the inner device); Worker and Attach give other workers their Ports.
type Engine struct {
	flows *FlowTable
	now   func() time.Time
	start time.Time
	ports []*Port // Worker views over inner, created on demand; guarded by mu
	inner Device

	state atomic.Pointer[engineState]
	mu    sync.Mutex // serialises SetConfig and Port creation

	nextExpire atomic.Int64 // ns: when a Read next sweeps idle flows
	expireStep atomic.Int64 // ns between shard sweeps: see sweepEvery

	shardMax int
	stats    []engineCounters // one per stats shard, padded

	back                    []netip.Prefix // EngineOptions.BackPrefixes
	targetMinRTO, ownMinRTO int64          // ns
}

// engineState is what a config swap replaces whole.
type engineState struct {
	cfg     *policy.Config
	gen     uint32
	meters  *Meters
	svcIdx  map[*policy.VirtualServer]int
	actIdx  map[*policy.Action]int
	noRow   int32
	prev    *Meters   // the meters before the last swap, still settling
	carried []Traffic // what was carried from prev, per prev row
}

type engineCounters struct {
	dropped         [numDropReasons]atomic.Uint64
	egressMalformed atomic.Uint64
	fragments       atomic.Uint64
	marked          atomic.Uint64
	uncached        atomic.Uint64
	_               [64]byte
}

var _ Device = (*Engine)(nil)

// NewEngine returns an engine over inner classifying by cfg, which must be
// compiled (policy.Compile).
func NewEngine(inner Device, cfg *policy.Config, o EngineOptions) *Engine {
	if o.Now == nil {
		o.Now = time.Now
	}
	shards := max(o.Workers, runtime.GOMAXPROCS(0), 1)
	n := 1
	for n < shards {
		n <<= 1
	}
	e := &Engine{flows: NewFlowTable(o.Flows), now: o.Now, inner: inner, shardMax: n,
		back: append([]netip.Prefix(nil), o.BackPrefixes...), targetMinRTO: int64(o.TargetMinRTO), ownMinRTO: int64(o.OwnMinRTO)}
	if e.targetMinRTO <= 0 {
		e.targetMinRTO = int64(DefaultTargetMinRTO)
	}
	if e.ownMinRTO <= 0 {
		e.ownMinRTO = int64(DefaultOwnMinRTO)
	}
	e.start = e.now()
	e.stats = make([]engineCounters, n)
	e.install(cfg, nil)
	e.nextExpire.Store(e.expireStep.Load())
	e.ports = []*Port{{e: e, inner: inner, shard: 0}}
	return e
}

func (e *Engine) install(cfg *policy.Config, old *engineState) {
	st := &engineState{cfg: cfg, meters: NewMeters(cfg, e.shardMax),
		svcIdx: make(map[*policy.VirtualServer]int, len(cfg.Services)),
		actIdx: make(map[*policy.Action]int, len(cfg.Actions))}
	for i, vs := range cfg.Services {
		st.svcIdx[vs] = i
	}
	for i, a := range cfg.Actions {
		st.actIdx[a] = i
	}
	st.noRow = st.meters.NoRow()
	e.expireStep.Store(e.sweepEvery(cfg))
	if old != nil {
		st.gen = old.gen + 1
		if old.prev != nil {
			// Packets counted on the meters before last after they were
			// carried (a batch in flight during that swap) are carried now.
			old.meters.carry(old.prev, old.carried)
		}
		st.prev = old.meters
		st.carried = st.meters.carry(old.meters, nil)
	}
	e.state.Store(st)
}

// SetConfig swaps in a new compiled config. Cached flow decisions become
// stale and are remade on each flow's next packet; meters carry over by
// name (virtual server, action, target), so no counter is lost.
func (e *Engine) SetConfig(cfg *policy.Config) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.install(cfg, e.state.Load())
}

// Config returns the config in use.
func (e *Engine) Config() *policy.Config { return e.state.Load().cfg }

// Generation returns the number of config swaps so far.
func (e *Engine) Generation() uint64 { return uint64(e.state.Load().gen) }

// Meters returns the current config's meters.
func (e *Engine) Meters() *Meters { return e.state.Load().meters }

var _ policy.ByteTotals = (*Engine)(nil)

// ServiceBytes returns the running byte total of the virtual server called
// name on the current meters (see Meters.ServiceBytes). Meters carry their
// counts by name across SetConfig, so the total never goes back: it is what
// Admission.Recompute reads.
func (e *Engine) ServiceBytes(name string) (uint64, bool) {
	return e.state.Load().meters.ServiceBytes(name)
}

// Flows returns the flow table.
func (e *Engine) Flows() *FlowTable { return e.flows }

// Flow returns the live flow between client and server (a VIP and port)
// with IP protocol proto, or nil. The caller may Bind a target to it.
func (e *Engine) Flow(client, server netip.AddrPort, proto uint8) *Flow {
	k := NewFlowKey(client, server, proto)
	return e.flows.Lookup(&k, k.Hash(), e.clock())
}

// Reclassify decides the live flow between client and server again as if
// its client were as, and returns it (a new Flow when the decision
// changed), or nil when there is none. It is for a connection that came
// through an outer load balancer (client) on behalf of as, the client a
// PROXY-protocol header named: the rule, ToS and meter row of as then
// apply to the flow's packets. The flow keeps its key, its target binding,
// its measurement and its half-open state. A flow decided under an older
// config is returned as it is (its next packet decides it again under the
// new config, for its key's client, until the next Reclassify). A
// reclassified flow that a config swap decides again is decided for as.
func (e *Engine) Reclassify(client, server netip.AddrPort, proto uint8, as netip.AddrPort) *Flow {
	k := NewFlowKey(client, server, proto)
	h := k.Hash()
	now := e.clock()
	f := e.flows.Lookup(&k, h, now)
	st := e.state.Load()
	if f == nil || f.Gen != st.gen {
		return f
	}
	rk := NewFlowKey(as, server, proto)
	// f's service, not the VIP's first: a tls flow its ClientHello routed
	// (Reroute) stays in the service it was routed to.
	_, act, v := st.decideFor(&rk, f.Service)
	if f.as != nil && *f.as == as && f.Action == act && f.Row == v.row && f.TOS == v.tos && f.SetTOS == v.setTOS {
		return f
	}
	nf := &Flow{Key: f.Key, Service: f.Service, Action: act, TOS: v.tos, SetTOS: v.setTOS, Gen: st.gen, Row: v.row}
	nf.half.Store(f.half.Load())
	nf.seg, nf.as = f.seg, &as
	for d := range nf.app {
		nf.app[d].w.Store(f.app[d].w.Load())
	}
	if e.flows.insert(nf, h, now, f.target.Load()) == nil {
		return f
	}
	return nf
}

// Segments returns the passive measurement of the back-leg TCP flow from
// local (a back arm's address and port) to remote (the target), or nil when
// the engine has no such flow or does not measure it.
func (e *Engine) Segments(local, remote netip.AddrPort) *SegStats {
	k := NewFlowKey(remote, local, ProtoTCP)
	if f := e.flows.Lookup(&k, k.Hash(), e.clock()); f != nil {
		return f.seg
	}
	return nil
}

// Stats returns the engine's counters summed over its shards.
func (e *Engine) Stats() EngineStats {
	var s EngineStats
	for i := range e.stats {
		c := &e.stats[i]
		for r := range c.dropped {
			s.Dropped[r] += c.dropped[r].Load()
		}
		s.EgressMalformed += c.egressMalformed.Load()
		s.Fragments += c.fragments.Load()
		s.Marked += c.marked.Load()
		s.Uncached += c.uncached.Load()
	}
	return s
}

// Worker returns the Port of worker i over the inner device: a Device
// whose Reads count into shard i. Several workers may Read the inner device
// concurrently when it allows it (a MemDevice does).
func (e *Engine) Worker(i int) *Port {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, p := range e.ports {
		if p.shard == i && p.inner == e.inner {
			return p
		}
	}
	p := &Port{e: e, inner: e.inner, shard: i}
	e.ports = append(e.ports, p)
	return p
}

// Attach returns a Port over another device that shares the engine's flow
// table, config and meters, counting into shard i: one per queue of a
// multiqueue TUN.
func (e *Engine) Attach(dev Device, i int) *Port {
	return &Port{e: e, inner: dev, shard: i}
}

// Read implements Device as worker 0.
func (e *Engine) Read(bufs [][]byte, sizes []int, offset int) (int, error) {
	return e.ports[0].Read(bufs, sizes, offset)
}

// Write implements Device as worker 0.
func (e *Engine) Write(bufs [][]byte, offset int) (int, error) {
	return e.ports[0].Write(bufs, offset)
}

// BatchSize implements Device.
func (e *Engine) BatchSize() int { return e.inner.BatchSize() }

// MTU implements Device.
func (e *Engine) MTU() int { return e.inner.MTU() }

// Close implements Device: it closes the inner device.
func (e *Engine) Close() error { return e.inner.Close() }

// clock returns the engine's monotonic time in ns.
func (e *Engine) clock() int64 { return int64(e.now().Sub(e.start)) }

// Port is one worker's Device view of an Engine: its Read and Write run the
// engine's per-packet flow over its inner device, counting ingress into its
// shard. Read and Write may be called from any number of goroutines (gVisor
// writes from many); a Port keeps no per-call state, and its shard is only
// where its ingress counts land.
type Port struct {
	e     *Engine
	inner Device
	shard int
}

var _ Device = (*Port)(nil)

// Read implements Device: it reads from the inner device and returns the
// packets that parsed, each classified and metered (see the file comment).
// Malformed packets are dropped and counted; Read does not return an empty
// batch unless the inner device fails.
func (p *Port) Read(bufs [][]byte, sizes []int, offset int) (int, error) {
	e := p.e
	for {
		n, err := p.inner.Read(bufs, sizes, offset)
		if n == 0 {
			return 0, err
		}
		now := e.clock()
		if now >= e.nextExpire.Load() {
			e.expire(now)
		}
		st := e.state.Load()
		c := e.shardOf(p.shard)
		run := meterRun{m: st.meters, shard: p.shard, d: Ingress}
		gso := offloads(p.inner, offset)
		w := 0
		var pk Packet
		var last lastFlow
		for i := range n {
			b := bufs[i][offset : offset+sizes[i]]
			if r := Parse(b, &pk); r != DropNone {
				c.dropped[r].Add(1)
				continue
			}
			// A super-packet stands for segs segments on the wire (one
			// when offload is off): meters and the sequence tracker
			// count those, not the one buffer.
			segs, size := Segments(gsoHdr(gso, bufs[i], offset), b, &pk)
			row, target := st.noRow, int32(NoTarget)
			if pk.NonFirstFragment {
				c.fragments.Add(1)
			} else {
				k := last.next()
				pk.ingressKeyInto(k)
				if !last.same() {
					last.set(p.flow(st, k, k.Hash(), now, c))
				}
				if last.v.half != nil && pk.TCPFlags&(TCPSyn|TCPRst|TCPAck) == TCPAck {
					e.flows.confirm(last.v.half) // the client's handshake ACK
					last.v.half = nil
				}
				row, target = last.v.row, last.v.target
				if last.v.seg != nil {
					last.v.seg.ingress(b, &pk, segs, now, e.targetMinRTO)
				}
			}
			if w != i {
				// Compact over a dropped packet; a caller buffer too short
				// to take it (buffers of mixed sizes) drops it.
				if len(bufs[w])-offset < len(b) {
					c.dropped[DropTruncated].Add(1)
					continue
				}
				sizes[w] = copy(bufs[w][offset:], b)
				if gso {
					copy(bufs[w][offset-VirtioNetHdrLen:offset], bufs[i][offset-VirtioNetHdrLen:offset])
				}
			}
			run.addSegs(row, target, segs, size, appPayload(last.v.app, Ingress, target, b, &pk, PayloadLen(b, &pk)))
			w++
		}
		run.flush()
		if w > 0 || err != nil {
			return w, err
		}
	}
}

// lastFlow remembers the previous packet's flow within one batch: a burst
// of one flow (a TSO-sized write split into segments) costs one lookup.
// It holds two key slots: the packet's key is built in place in one (next),
// compared with the other (same), and becomes the previous one when its
// verdict is set, so no key is copied.
type lastFlow struct {
	keys [2]FlowKey
	cur  int // the slot next fills; cur^1 holds the previous key
	v    verdict
	ok   bool
}

func (l *lastFlow) next() *FlowKey { return &l.keys[l.cur] }

// same reports whether the key in the next slot is the previous packet's.
func (l *lastFlow) same() bool { return l.ok && l.keys[l.cur].equal(&l.keys[l.cur^1]) }

// set records v as the verdict of the key in the next slot.
func (l *lastFlow) set(v verdict) {
	l.v, l.ok = v, true
	l.cur ^= 1
}

// verdict is what the per-packet path needs from a flow.
type verdict struct {
	row, target int32
	tos         uint8
	setTOS      bool
	seg         *SegStats
	app         *[2]appSpace // the flow's application byte state, nil without a Flow
	half        *Flow        // the flow while half-open: Read confirms it on the client's ACK
}

// flow returns the verdict for k (hash h): from its cached flow, or, when
// the flow is missing or was decided under an older config, from a new
// decision, which is inserted as a Flow when the table has room. A full
// table costs no allocation: the decision is used for this packet only and
// counted as Uncached.
func (p *Port) flow(st *engineState, k *FlowKey, h uint64, now int64, c *engineCounters) verdict {
	e := p.e
	f := e.flows.Lookup(k, h, now)
	if f != nil && f.Gen == st.gen {
		v := verdict{f.Row, f.target.Load(), f.TOS, f.SetTOS, f.seg, &f.app, nil}
		if f.half.Load() {
			v.half = f
		}
		return v
	}
	return p.newFlow(st, k, h, now, c, f)
}

// newFlow decides k's flow (f is its stale entry or nil) and inserts it.
func (p *Port) newFlow(st *engineState, k *FlowKey, h uint64, now int64, c *engineCounters, f *Flow) verdict {
	e := p.e
	// A flow a PROXY-protocol header reclassified (Reclassify) is decided
	// for the client the header named, not the load balancer the key
	// holds.
	dk := k
	if f != nil && f.as != nil {
		rk := NewFlowKey(*f.as, k.ServerAddrPort(), k.Proto)
		dk = &rk
	}
	vs, act, v := st.decide(dk)
	if f != nil {
		// A tls flow routed by its ClientHello (Reroute) stays in its
		// service across a config swap, found again by name.
		if rs := st.rerouted(k, f.Service, vs); rs != nil {
			vs, act, v = st.decideFor(dk, rs)
		}
	}
	if f == nil && !e.flows.room(h) {
		c.uncached.Add(1)
		return v
	}
	// A flow reclassified after a config swap keeps its bound target when
	// the new config still has it (by service and target name), so that
	// the target's meters go on counting the connection.
	if f != nil && st.prev != nil && f.Gen+1 == st.gen {
		if id := f.target.Load(); id >= 0 {
			v.target = int32(st.meters.remapTarget(st.prev, int(id)))
		}
	}
	nf := &Flow{Key: *k, Service: vs, Action: act, TOS: v.tos, SetTOS: v.setTOS, Gen: st.gen, Row: v.row}
	if k.Proto == ProtoTCP && vs != nil && (f == nil || f.half.Load()) {
		nf.half.Store(true) // confirmed by the client's next ACK (Read)
	}
	switch {
	case f != nil:
		nf.seg = f.seg // a replaced decision keeps the flow's measurement
		nf.as = f.as
		for d := range nf.app {
			nf.app[d].w.Store(f.app[d].w.Load())
		}
	case k.Proto == ProtoTCP && vs == nil && len(e.back) > 0 && isBack(e.back, addrFrom16(k.Server)):
		nf.seg = new(SegStats)
	}
	v.seg, v.app = nf.seg, &nf.app
	if e.flows.insert(nf, h, now, v.target) == nil {
		c.uncached.Add(1)
	}
	return v
}

// decide classifies k under st's config.
func (st *engineState) decide(k *FlowKey) (*policy.VirtualServer, *policy.Action, verdict) {
	server := k.ServerAddrPort()
	return st.decideFor(k, st.cfg.Service(server.Addr(), server.Port(), k.Proto))
}

// decideFor classifies k as a flow of vs (nil: none) under st's config.
func (st *engineState) decideFor(k *FlowKey, vs *policy.VirtualServer) (*policy.VirtualServer, *policy.Action, verdict) {
	server, client := k.ServerAddrPort(), k.ClientAddrPort()
	act := st.cfg.Classify(k.Proto, server, client, vs)
	v := verdict{target: NoTarget}
	svc, ai := -1, -1
	if vs != nil {
		svc = st.svcIdx[vs]
	}
	if act != nil {
		ai = st.actIdx[act]
		v.tos, v.setTOS = act.OutgoingTOS, act.SetTOS
	}
	v.row = st.meters.Row(svc, ai)
	return vs, act, v
}

// Write implements Device: it meters and marks each packet toward a client
// (see the file comment), then writes the batch to the inner device. The
// ToS byte and IPv4 checksum of bufs may be rewritten in place. Malformed
// packets are counted and passed on unchanged.
func (p *Port) Write(bufs [][]byte, offset int) (int, error) {
	e := p.e
	now := e.clock()
	if now >= e.nextExpire.Load() {
		e.expire(now)
	}
	st := e.state.Load()
	// Egress comes from many goroutines at once (gVisor): each batch
	// counts into a shard picked by its first flow's hash rather than the
	// Port's, which spreads the writers over the shards.
	run := meterRun{m: st.meters, shard: -1, d: Egress}
	var pk Packet
	var last lastFlow
	var marked uint64
	gso := offloads(p.inner, offset)
	for _, buf := range bufs {
		if offset > len(buf) {
			// No packet at all: passed on as the inner device sees it,
			// counted like any other that does not parse.
			e.shardOf(p.shard).egressMalformed.Add(1)
			continue
		}
		b := buf[offset:]
		if Parse(b, &pk) != DropNone {
			e.shardOf(p.shard).egressMalformed.Add(1)
			continue
		}
		if pk.NonFirstFragment {
			e.shardOf(p.shard).fragments.Add(1)
			if run.shard < 0 {
				run.shard = p.shard
			}
			run.add(st.noRow, NoTarget, pk.Len, 0)
			continue
		}
		k := last.next()
		pk.egressKeyInto(k)
		if !last.same() {
			h := k.Hash()
			if run.shard < 0 {
				run.shard = int(h >> 8)
			}
			last.set(p.flow(st, k, h, now, e.shardOf(run.shard)))
		}
		segs, size := Segments(gsoHdr(gso, buf, offset), b, &pk)
		run.addSegs(last.v.row, last.v.target, segs, size, appPayload(last.v.app, Egress, last.v.target, b, &pk, PayloadLen(b, &pk)))
		if last.v.seg != nil {
			last.v.seg.egress(b, &pk, segs, now, e.ownMinRTO)
		}
		if last.v.setTOS && SetTOS(b, last.v.tos) {
			marked++
		}
	}
	run.flush()
	if marked > 0 {
		e.shardOf(run.shard).marked.Add(marked)
	}
	return p.inner.Write(bufs, offset)
}

// shardOf returns the counters of shard i, any int (a port's shard or a
// flow hash's bits): the one place a shard number is reduced to the
// engine's power-of-two count.
func (e *Engine) shardOf(i int) *engineCounters { return &e.stats[i&(e.shardMax-1)] }

// expire sweeps flow-table shards for idle and stale half-open flows; the
// first Read or Write past nextExpire does it (one caller wins the CAS).
// Shards are swept in turn, each once per quarter of the idle timeout or
// of the shortest handshake timeout, whichever is less (sweepEvery), so no
// packet pays for a scan of the whole table; after a quiet spell it sweeps
// the shards it fell behind on, up to all of them.
func (e *Engine) expire(now int64) {
	next, step := e.nextExpire.Load(), e.expireStep.Load()
	if now < next {
		return
	}
	// The steps due since next, each on its own schedule (next + k·step),
	// so that sweeps called late (a packet, a timer tick) do not push
	// every later one back: a shard is swept once per Shards steps.
	due := (now-next)/step + 1
	then := next + due*step
	if n := int64(e.flows.Shards()); due > n {
		due, then = n, now+step // a quiet spell: one full pass, then on
	}
	if !e.nextExpire.CompareAndSwap(next, then) {
		return
	}
	for ; due > 0; due-- {
		e.flows.ExpireStep(now)
	}
}

// Sweep sweeps the flow-table shards that are due, as the first packet
// past a sweep time does: the control plane calls it on a timer (every
// recompute interval), so that a table a flood filled drains within
// timeouts.handshake even when no packet passes after the flood, and its
// flows and half-open counts say so. It costs nothing when no sweep is
// due, and one shard's scan per due step otherwise.
func (e *Engine) Sweep() {
	if now := e.clock(); now >= e.nextExpire.Load() {
		e.expire(now)
	}
}

// sweepEvery is the time between two shard sweeps under cfg: every shard
// is swept once per quarter of the idle timeout, or of the shortest
// handshake timeout (half-open flows), whichever is less.
func (e *Engine) sweepEvery(cfg *policy.Config) int64 {
	period := min(e.flows.idle, e.flows.handshake)
	for _, vs := range cfg.Services {
		if hs := int64(vs.Timeouts.Handshake); hs > 0 {
			period = min(period, hs)
		}
	}
	return max(period/4/int64(e.flows.Shards()), 1)
}

// BatchSize implements Device.
func (p *Port) BatchSize() int { return p.inner.BatchSize() }

// MTU implements Device.
func (p *Port) MTU() int { return p.inner.MTU() }

// Close implements Device: it closes the inner device.
func (p *Port) Close() error { return p.inner.Close() }
