package datapath

// Meter flow
//
//	per packet: worker w ─► shard w ─► row (service, action) += 1 packet, n bytes
//	                                 ─► target row        += 1 packet, n bytes (if bound)
//	                                 ─► target payload row += 1 packet, TCP/UDP payload (if bound;
//	                                    TCP: new sequence space only, appspace.go)
//	per read (recompute loop, API): Σ shards ─► rows ─► services, classes (their
//	        services, through the parent chain), actions, targets, instance
//	admission (every recompute): Engine.ServiceBytes ─► Meters.ServiceBytes ─►
//	        policy.Admission's levels (the one byte path to the limits): the
//	        service's target rows only, so only admitted connections count
//	        (a flow is bound to its target when admission accepts it; a
//	        refused one, its handshake and its 503 page, never is)
//
// Each worker writes only its own shard, whose counters sit in their own
// cache lines, so workers never contend. The adds are atomic anyway: a
// caller that shares a shard between goroutines (gVisor writes from many)
// stays correct and only pays for contention. A flow carries one row, the
// pair of its virtual server and policy action, so Add costs two atomic
// adds, four once a target is bound; the engine goes further and adds a
// run of consecutive packets of one row in one AddN (meterRun), so a batch
// of one service's traffic costs a few adds in all. The levels above
// (class, instance) are sums the reader computes, which also makes them
// exact at every level at every read.

import (
	"sync/atomic"

	"weir/policy"
)

// Dir is the direction of a packet through the datapath.
type Dir uint8

// The two directions.
const (
	Ingress Dir = iota // client → stack (Read)
	Egress             // stack → client (Write)
)

// Counter is a packet and byte count.
type Counter struct{ Packets, Bytes uint64 }

// Traffic is a Counter per direction, indexed by Dir.
type Traffic [2]Counter

// Bytes returns the bytes of both directions.
func (t *Traffic) Bytes() uint64 { return t[Ingress].Bytes + t[Egress].Bytes }

func (t *Traffic) add(o *Traffic) {
	for d := range t {
		t[d].Packets += o[d].Packets
		t[d].Bytes += o[d].Bytes
	}
}

// MeterTotals are the summed meters of one config, each slice parallel to
// the config's list of the same name. Targets are numbered in the order of
// the config's services, then each service's targets (see Meters.TargetID).
type MeterTotals struct {
	Instance Traffic   // everything, classified or not
	Classes  []Traffic // a class counts its services and its child classes'
	Services []Traffic
	Actions  []Traffic
	Targets  []Traffic
	// NoService counts packets of flows that matched no virtual server and
	// of non-first fragments, which cannot be matched; NoAction those of
	// flows no rule matched. Both are part of Instance.
	NoService, NoAction Traffic
}

// Meters are the per-shard packet and byte counters of one config.
type Meters struct {
	cfg      *policy.Config
	nSvc     int // services + 1 (the last row: no service)
	nAct     int // actions + 1 (the last: no action)
	nTargets int
	targetAt []int          // first target ID of each service
	svcIdx   map[string]int // service index by name, for ServiceBytes
	shards   []meterShard
	mask     int
}

type meterShard struct {
	// c holds nSvc*nAct rows for the (service, action) pairs, then one row
	// per target, then one payload row per target (packets and TCP or UDP
	// payload bytes of the target's bound flows); each row is 4 counters: ingress packets, ingress bytes,
	// egress packets, egress bytes. The slice is allocated apart for each
	// shard with a cache line of padding on either side.
	c []atomic.Uint64
}

// cacheLineWords is the padding, in 8-byte words, kept around each shard.
const cacheLineWords = 8

// NewMeters returns zeroed meters for cfg (compiled) with shards rounded up
// to a power of two (zero means one).
func NewMeters(cfg *policy.Config, shards int) *Meters {
	n := 1
	for n < shards {
		n <<= 1
	}
	m := &Meters{cfg: cfg, nSvc: len(cfg.Services) + 1, nAct: len(cfg.Actions) + 1, shards: make([]meterShard, n), mask: n - 1}
	m.svcIdx = make(map[string]int, len(cfg.Services))
	for i, vs := range cfg.Services {
		m.targetAt = append(m.targetAt, m.nTargets)
		m.nTargets += len(vs.Targets)
		m.svcIdx[vs.Name] = i
	}
	rows := m.nSvc*m.nAct + 2*m.nTargets
	for i := range m.shards {
		c := make([]atomic.Uint64, rows*4+2*cacheLineWords)
		m.shards[i].c = c[cacheLineWords : cacheLineWords+rows*4 : cacheLineWords+rows*4]
	}
	return m
}

// Config returns the config the meters were laid out for.
func (m *Meters) Config() *policy.Config { return m.cfg }

// Shards returns the number of shards.
func (m *Meters) Shards() int { return len(m.shards) }

// Row returns the row of flows at service index svc (into Config.Services,
// or -1 for none) under action index act (into Config.Actions, or -1).
func (m *Meters) Row(svc, act int) int32 {
	if svc < 0 || svc >= m.nSvc-1 {
		svc = m.nSvc - 1
	}
	if act < 0 || act >= m.nAct-1 {
		act = m.nAct - 1
	}
	return int32(svc*m.nAct + act)
}

// NoRow is the row of packets that belong to no flow: no service, no
// action.
func (m *Meters) NoRow() int32 { return m.Row(-1, -1) }

// TargetID returns the ID of target i of service index svc, the number a
// Flow is bound to, or NoTarget when there is no such target. IDs number the
// targets in the order of the config's services, then of each service's
// targets: the ID of a target is its policy.Config.TargetIndex.
func (m *Meters) TargetID(svc, i int) int {
	if svc < 0 || svc >= len(m.targetAt) || i < 0 || i >= len(m.cfg.Services[svc].Targets) {
		return NoTarget
	}
	return m.targetAt[svc] + i
}

// remapTarget returns the ID in m of the target that had ID id in old
// (matched by service and target name), or NoTarget.
func (m *Meters) remapTarget(old *Meters, id int) int {
	for s := len(old.targetAt) - 1; s >= 0; s-- {
		if id < old.targetAt[s] {
			continue
		}
		ovs := old.cfg.Services[s]
		i := id - old.targetAt[s]
		if i >= len(ovs.Targets) {
			return NoTarget
		}
		ns := indexByName(len(m.cfg.Services), func(j int) string { return m.cfg.Services[j].Name }, ovs.Name)
		if ns < 0 {
			return NoTarget
		}
		nt := indexByName(len(m.cfg.Services[ns].Targets), func(j int) string { return m.cfg.Services[ns].Targets[j].Name }, ovs.Targets[i].Name)
		return m.TargetID(ns, nt)
	}
	return NoTarget
}

// Add counts one packet of n bytes, payload of them TCP or UDP payload, in
// direction d for row and, when target is not NoTarget, for that target, in
// shard (taken modulo the shard count). It takes no lock and does not
// allocate.
func (m *Meters) Add(shard int, row int32, target int32, d Dir, n, payload int) {
	m.AddN(shard, row, target, d, 1, uint64(n), uint64(payload))
}

// AddN counts packets packets of bytes bytes in total, payload of them TCP
// or UDP payload, as Add does for one.
func (m *Meters) AddN(shard int, row int32, target int32, d Dir, packets, bytes, payload uint64) {
	c := m.shards[shard&m.mask].c
	i := int(row)*4 + int(d)*2
	if uint(i+1) < uint(len(c)) {
		c[i].Add(packets)
		c[i+1].Add(bytes)
	}
	if target >= 0 && int(target) < m.nTargets {
		j := (m.nSvc*m.nAct+int(target))*4 + int(d)*2
		c[j].Add(packets)
		c[j+1].Add(bytes)
		j += m.nTargets * 4
		c[j].Add(packets)
		c[j+1].Add(payload)
	}
}

// PayloadLen returns the transport payload of a parsed packet b (p from
// Parse): the TCP segment's data after its header (options included) or
// the UDP datagram's data; 0 for other protocols, fragments and headers
// that do not fit. It does not allocate.
func PayloadLen(b []byte, p *Packet) int {
	if p.Fragment || p.L4Off <= 0 || p.Len > len(b) {
		return 0
	}
	switch p.Proto {
	case ProtoTCP:
		if p.L4Off+13 > p.Len {
			return 0
		}
		h := int(b[p.L4Off+12]>>4) * 4
		return max(p.Len-p.L4Off-h, 0)
	case ProtoUDP:
		return max(p.Len-p.L4Off-8, 0)
	}
	return 0
}

// meterRun coalesces the packets of one batch that fall in the same row
// (and target) in a row, so that a batch of one service's traffic costs a
// few atomic adds instead of two per packet. It lives on the stack of one
// Read or Write call; flush must be called before the call returns.
type meterRun struct {
	m                      *Meters
	shard                  int
	d                      Dir
	row, target            int32
	packets, size, payload uint64
}

func (r *meterRun) add(row, target int32, n, payload int) {
	if row != r.row || target != r.target {
		r.flush()
		r.row, r.target = row, target
	}
	r.packets++
	r.size += uint64(n)
	r.payload += uint64(payload)
}

func (r *meterRun) flush() {
	if r.packets > 0 {
		r.m.AddN(r.shard, r.row, r.target, r.d, r.packets, r.size, r.payload)
		r.packets, r.size, r.payload = 0, 0, 0
	}
}

var _ policy.ByteTotals = (*Meters)(nil)

// ServiceBytes returns the running byte total, both directions, of the
// admitted connections of the virtual server called name in the meters'
// config, and false when the config has no such service. What it counts
// follows the config's Instance.BandwidthBytes: the TCP (or UDP) payload,
// the Sun seed's application bytes, by default; whole packets with
// policy.CountWire. Either way only flows bound to a target count: the
// packets of a refused connection (its handshake, the 503 page) never
// reach a level. It is the meters' side of the one byte path to admission
// (policy.ByteTotals): Admission.Recompute reads it every recompute
// interval. It sums the service's target rows over the shards and does not
// allocate.
func (m *Meters) ServiceBytes(name string) (uint64, bool) {
	s, ok := m.svcIdx[name]
	if !ok {
		return 0, false
	}
	base := m.nSvc*m.nAct + m.targetAt[s]
	if m.cfg.Instance.BandwidthBytes != policy.CountWire {
		base += m.nTargets
	}
	var n uint64
	for i := range m.cfg.Services[s].Targets {
		t := m.rowTraffic(base + i)
		n += t.Bytes()
	}
	return n, true
}

// TargetPayload returns the payload row of target id (see TargetID): the
// packets and TCP or UDP payload bytes of the flows bound to it.
func (m *Meters) TargetPayload(id int) Traffic {
	if id < 0 || id >= m.nTargets {
		return Traffic{}
	}
	return m.rowTraffic(m.nSvc*m.nAct + m.nTargets + id)
}

// rowTraffic sums row r over the shards.
func (m *Meters) rowTraffic(r int) Traffic {
	var t Traffic
	for s := range m.shards {
		c := m.shards[s].c[r*4 : r*4+4]
		t[Ingress].Packets += c[0].Load()
		t[Ingress].Bytes += c[1].Load()
		t[Egress].Packets += c[2].Load()
		t[Egress].Bytes += c[3].Load()
	}
	return t
}

// Totals sums the shards into dst, reusing its slices when they are long
// enough. Each counter is read atomically; the totals are a consistent
// lower bound of what was counted before the call.
func (m *Meters) Totals(dst *MeterTotals) {
	cfg := m.cfg
	*dst = MeterTotals{
		Classes:  resize(dst.Classes, len(cfg.Classes)),
		Services: resize(dst.Services, len(cfg.Services)),
		Actions:  resize(dst.Actions, len(cfg.Actions)),
		Targets:  resize(dst.Targets, m.nTargets),
	}
	for s := 0; s < m.nSvc; s++ {
		for a := 0; a < m.nAct; a++ {
			t := m.rowTraffic(s*m.nAct + a)
			dst.Instance.add(&t)
			if s < len(dst.Services) {
				dst.Services[s].add(&t)
			} else {
				dst.NoService.add(&t)
			}
			if a < len(dst.Actions) {
				dst.Actions[a].add(&t)
			} else {
				dst.NoAction.add(&t)
			}
		}
	}
	for i := range dst.Targets {
		dst.Targets[i] = m.rowTraffic(m.nSvc*m.nAct + i)
	}
	for s, vs := range cfg.Services {
		for c := vs.Class; c != nil; c = c.Parent {
			if i := classIndex(cfg, c); i >= 0 {
				dst.Classes[i].add(&dst.Services[s])
			}
		}
	}
}

func classIndex(cfg *policy.Config, c *policy.Class) int {
	for i, o := range cfg.Classes {
		if o == c {
			return i
		}
	}
	return -1
}

func resize(s []Traffic, n int) []Traffic {
	if cap(s) < n {
		return make([]Traffic, n)
	}
	s = s[:n]
	clear(s)
	return s
}

// carry adds old's totals into m's shard 0, row by row, matching services,
// actions and targets by name; what has no match in m's config goes to the
// no-service or no-action row, so the instance total carries whole. It
// returns what it carried, per old row, for a later carryDelta.
func (m *Meters) carry(old *Meters, already []Traffic) []Traffic {
	oc, nc := old.cfg, m.cfg
	svcMap := make([]int, old.nSvc)
	for i := range svcMap {
		svcMap[i] = -1
		if i < len(oc.Services) {
			svcMap[i] = indexByName(len(nc.Services), func(j int) string { return nc.Services[j].Name }, oc.Services[i].Name)
		}
	}
	actMap := make([]int, old.nAct)
	for i := range actMap {
		actMap[i] = -1
		if i < len(oc.Actions) {
			actMap[i] = indexByName(len(nc.Actions), func(j int) string { return nc.Actions[j].Name }, oc.Actions[i].Name)
		}
	}
	rows := old.nSvc*old.nAct + 2*old.nTargets
	got := make([]Traffic, rows)
	c := m.shards[0].c
	put := func(r int, t *Traffic) {
		for d := range t {
			c[r*4+d*2].Add(t[d].Packets)
			c[r*4+d*2+1].Add(t[d].Bytes)
		}
	}
	for s := 0; s < old.nSvc; s++ {
		for a := 0; a < old.nAct; a++ {
			r := s*old.nAct + a
			t := old.rowTraffic(r)
			got[r] = t
			if already != nil {
				t = sub(t, already[r])
			}
			put(int(m.Row(svcMap[s], actMap[a])), &t)
		}
	}
	for s, vs := range oc.Services {
		ns := svcMap[s]
		for i, tg := range vs.Targets {
			r := old.nSvc*old.nAct + old.targetAt[s] + i
			t := old.rowTraffic(r)
			got[r] = t
			if already != nil {
				t = sub(t, already[r])
			}
			if ns < 0 {
				continue // the service is gone; its bytes stay in the instance
			}
			j := indexByName(len(nc.Services[ns].Targets), func(j int) string { return nc.Services[ns].Targets[j].Name }, tg.Name)
			if id := m.TargetID(ns, j); id != NoTarget {
				put(m.nSvc*m.nAct+id, &t)
			}
			// The payload row of the same target.
			r += old.nTargets
			p := old.rowTraffic(r)
			got[r] = p
			if already != nil {
				p = sub(p, already[r])
			}
			if id := m.TargetID(ns, j); id != NoTarget {
				put(m.nSvc*m.nAct+m.nTargets+id, &p)
			}
		}
	}
	return got
}

func sub(a, b Traffic) Traffic {
	for d := range a {
		a[d].Packets -= b[d].Packets
		a[d].Bytes -= b[d].Bytes
	}
	return a
}

func indexByName(n int, name func(int) string, want string) int {
	for i := range n {
		if name(i) == want {
			return i
		}
	}
	return -1
}
