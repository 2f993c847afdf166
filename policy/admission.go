package policy

//go:generate go run golang.org/x/tools/cmd/stringer@v0.52.0 -type=LevelKind,LimitKind -linecomment -output=admission_string.go
import (
	"math"
	"math/bits"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Admission limits: the Sun Web Server quality-of-service feature.
//
// Flow of one new connection (Admit, lock-free, no allocation):
//
//	virtual server ──► its class ──► the class's parents ──► instance
//	   each level, in that order:
//	     bandwidth: the level's window rate  ≥ MaxBandwidth  ─┐ enforced: refuse,
//	     burst:     the level's token bucket ≤ 0 (optional)  ─┤ undo the levels
//	     connections: open + 1               > MaxConnections ┘ already counted,
//	                                                            name every limit over
//	   not enforced and over: admit anyway; the crossing is an Event
//	   a limit the virtual server sets itself replaces the same limit of its
//	   classes and the instance for its connections (not checked there,
//	   still counted there)
//	accepted: every level counted +1, the Ticket remembers the levels
//	Ticket.Release −1 once
//
// Override, Sun's "you can override these server or class-level settings
// for an individual virtual server": a virtual server that sets
// maxConnections (> 0) has its connections judged on its own connection
// limit and its own enforce flag only, not on the connection limit of its
// class, parent classes or instance; one that sets maxBandwidth (> 0) has
// them judged on its own bandwidth limit, enforce flag and burst bucket
// only. The two are independent: a virtual server that sets only
// maxConnections keeps its class's bandwidth limit. The enclosing levels
// still count its connections and bytes: a class's open connections and
// bandwidth are always the sum of all its members', so the class's limit
// still refuses (or logs for) the members that do not override, the
// overriding one's traffic included in the sum, and the class's crossing
// events are those of the sum. A virtual server that sets no limit of a
// kind inherits every enclosing level's limit of that kind, as before.
//
// Bytes take two paths. An http request's bytes are counted as the proxy
// moves them (Ticket.AddBytes, at every level of the ticket's chain). All
// other bytes: every RecomputeInterval the control plane calls
// Recompute with the datapath's meters (a ByteTotals), which reads each
// virtual server's running byte total once, adds what is new since the last
// read to every level of its chain (so a class's bytes are the exact sum of
// its members', the instance's of all), ticks each level's sliding Window
// with the level's total, refills the burst buckets and emits the over/under
// events.
//
// Statistics live in one record per level, matched by name across reloads
// (the instance is always the same record): Apply swaps the limits in
// atomically and keeps the counters and windows of every name still present,
// and a connection admitted under an old configuration is released from, and
// its bytes counted on, the same records the new configuration checks. A
// level that disappears while it still has open connections is kept, retired,
// until they close, and revived if a later configuration names it again.

// LevelKind names a level of the limit hierarchy.
type LevelKind uint8

// The levels, outermost first.
const (
	LevelInstance      LevelKind = iota // instance
	LevelClass                          // class
	LevelVirtualServer                  // virtual server
	// LevelClient is one client (address or prefix) of a virtual
	// server's or the instance's ClientLimits (clients.go).
	LevelClient // client
)

// MarshalText encodes k as its String form for the admin API.
func (k LevelKind) MarshalText() ([]byte, error) { return []byte(k.String()), nil }

// LimitKind names the limit a refusal or event is about, in the terms of the
// configuration.
type LimitKind uint8

// The limits of a level.
const (
	LimitMaxConnections LimitKind = iota // maxConnections
	LimitMaxBandwidth                    // maxBandwidth
	LimitBurst                           // burst
)

// MarshalText encodes k as its String form for the admin API.
func (k LimitKind) MarshalText() ([]byte, error) { return []byte(k.String()), nil }

// Refusal says why a connection was refused: the level and its name, the
// limit, the limit's value and the measured statistic that tripped it
// first, and in Also every other limit that was over at the same moment
// (Sun's error page states "which limits caused the 503"). Its Error text
// is the one line that goes into the log, the 503 page and the admin API,
// and names them all.
type Refusal struct {
	Over
	// Also holds the other limits over when the connection was refused, in
	// the order Admit checks them (NAlso of them; AlsoMore counts those
	// beyond MaxAlso). An array, not a slice: a refusal does not allocate.
	Also     [MaxAlso]Over
	NAlso    uint8
	AlsoMore uint8

	// The queue of the refusing level, when it has one (queue.go): Wait
	// joins it. qwaiting is its length at the refusal, qfull says the
	// refused connection found it full, waited how long it waited before a
	// timeout refused it.
	q        *waitQueue
	qmax     int64
	qtimeout time.Duration
	qwaiting int64
	qfull    bool
	waited   time.Duration
}

// Queued reports how long the refused connection waited in a queue (0:
// it did not) and whether it found the queue full.
func (r Refusal) Queued() (waited time.Duration, full bool) { return r.waited, r.qfull }

// MaxAlso bounds the limits a Refusal names besides its first: 3 levels of 3
// limits is 9 in all.
const MaxAlso = 8

// Over is one enforced limit found over at a refusal.
type Over struct {
	Level LevelKind
	Name  string
	Limit LimitKind
	// Value is the limit: connections, bytes per second, or BurstBytes.
	Value int64
	// Measured is the statistic: open connections, the window's bytes per
	// second, or the bytes left in the burst bucket (≤ 0).
	Measured int64
	// Shared says the connection limit is cluster-wide and what refused was
	// this instance's share of it, Share slots (see SetCapacity); Measured
	// is then this instance's open connections.
	Shared bool
	Share  int64
	// ClusterWide says a client's connection limit was judged cluster-wide
	// (ClientArbiter): Measured is then the client's connections open at
	// every member, Here those open at this one; Measured < 0 says the
	// cluster could not be asked and its fallback refuses.
	ClusterWide bool
	Here        int64
}

// Error returns the refusal as one line naming every limit over, the first
// one first, for example
//
//	virtual server "web": maxBandwidth 100 B/s exceeded (measured 166 B/s); class "gold": maxConnections 3 reached (3 open)
func (r Refusal) Error() string {
	b := r.Over.append(nil)
	for i := 0; i < int(r.NAlso); i++ {
		b = append(b, "; "...)
		b = r.Also[i].append(b)
	}
	if r.AlsoMore > 0 {
		b = append(b, "; and "...)
		b = strconv.AppendInt(b, int64(r.AlsoMore), 10)
		b = append(b, " more"...)
	}
	return string(r.appendQueue(b))
}

// String is Error.
func (r Refusal) String() string { return r.Error() }

// Limits returns every limit over, the first one first: Over, then Also.
func (r Refusal) Limits() []Over {
	out := make([]Over, 0, 1+int(r.NAlso))
	out = append(out, r.Over)
	return append(out, r.Also[:r.NAlso]...)
}

// add records o as one more limit over.
func (r *Refusal) add(o Over) {
	if int(r.NAlso) < MaxAlso {
		r.Also[r.NAlso] = o
		r.NAlso++
	} else if r.AlsoMore < 255 {
		r.AlsoMore++
	}
}

// Error returns the one limit as a line, for example
//
//	virtual server "web": maxBandwidth 100 B/s exceeded (measured 166 B/s)
func (o Over) Error() string { return string(o.append(nil)) }

func (o Over) append(b []byte) []byte {
	if o.ClusterWide && o.Measured < 0 {
		b = appendLimit(b, o.Level, o.Name, o.Limit, o.Value, o.Here, true)
		b = append(b[:len(b)-1], " here; the cluster could not be asked: failClosed)"...)
		return b
	}
	if o.ClusterWide {
		b = appendLimit(b, o.Level, o.Name, o.Limit, o.Value, o.Measured, true)
		b = append(b[:len(b)-1], " cluster-wide, "...)
		b = strconv.AppendInt(b, o.Here, 10)
		return append(b, " here)"...)
	}
	if o.Shared {
		b = appendLimit(b, o.Level, o.Name, o.Limit, o.Value, o.Measured, true)
		b = append(b[:len(b)-1], " here, this instance's share of the cluster-wide limit is "...)
		b = strconv.AppendInt(b, o.Share, 10)
		return append(b, ')')
	}
	return appendLimit(b, o.Level, o.Name, o.Limit, o.Value, o.Measured, true)
}

// appendLimit renders a level's limit and statistic, over or back under.
func appendLimit(b []byte, lk LevelKind, name string, k LimitKind, value, measured int64, over bool) []byte {
	b = append(b, lk.String()...)
	b = append(b, ' ')
	if lk == LevelClient {
		b = append(b, name...) // an address or prefix: client 198.18.5.1
	} else {
		b = strconv.AppendQuote(b, name)
	}
	b = append(b, ": "...)
	if !over {
		b = append(b, "back under "...)
	}
	b = append(b, k.String()...)
	b = append(b, ' ')
	b = strconv.AppendInt(b, value, 10)
	switch k {
	case LimitMaxConnections:
		if over {
			b = append(b, " reached"...)
		}
		b = append(b, " ("...)
		b = strconv.AppendInt(b, measured, 10)
		b = append(b, " open)"...)
	case LimitMaxBandwidth:
		b = append(b, " B/s"...)
		if over && measured == value {
			b = append(b, " reached"...) // an enforced limit refuses on reaching it
		} else if over {
			b = append(b, " exceeded"...)
		}
		b = append(b, " (measured "...)
		b = strconv.AppendInt(b, measured, 10)
		b = append(b, " B/s)"...)
	default:
		b = append(b, " B"...)
		if over {
			b = append(b, " exhausted"...)
		}
		b = append(b, " (bucket "...)
		b = strconv.AppendInt(b, measured, 10)
		b = append(b, " B)"...)
	}
	return b
}

// Event reports that a level's statistic crossed one of its limits: Over when
// it went above (connections above MaxConnections, bandwidth above
// MaxBandwidth, the burst bucket empty), !Over when it came back. There is one
// event per crossing, not one per connection: a connection limit that is not
// enforced reports its first excess at once, from Admit, and everything else
// is reported by Recompute, so a statistic hovering at a limit yields at most
// one pair of events per recompute interval. An enforced connection limit is
// never exceeded by the connections it judges; it reports when a reload
// lowers it below the open connections, or, at a class or the instance, when
// a member that overrides it (see Override) takes the sum above it; that
// excess is reported at once, from Admit.
type Event struct {
	// At is the time of the Recompute that saw the crossing, or for an
	// excess seen by Admit, of the last Recompute before it (zero before the
	// first Recompute).
	At       time.Time
	Level    LevelKind
	Name     string
	Limit    LimitKind
	Value    int64 // the limit
	Measured int64 // the statistic, as in Refusal
	Over     bool
	Enforced bool // the limit refuses connections; false: it is only logged
}

// String renders e as one log line.
func (e Event) String() string {
	b := appendLimit(nil, e.Level, e.Name, e.Limit, e.Value, e.Measured, e.Over)
	if e.Over {
		if e.Enforced {
			b = append(b, ", enforced"...)
		} else {
			b = append(b, ", not enforced"...)
		}
	}
	return string(b)
}

// DefaultEventBuffer is the number of events Admission holds for the control
// plane before it counts further ones as dropped.
const DefaultEventBuffer = 256

// Admission is the live admission state: one record per level (the instance,
// every class, every virtual server) with its open connections, byte counter,
// bandwidth window and burst bucket, and the limits of the current Config.
//
// Create one with NewAdmission; the zero value is not usable.
//
// Admit, Ticket.Release and Events may be called by any goroutine at any
// time; they take no lock and do not allocate. Apply, Recompute and Snapshot
// are the control plane's; they serialise on a mutex that the admission path
// never takes.
type Admission struct {
	st atomic.Pointer[admState]

	events  chan Event
	dropped atomic.Uint64
	now     atomic.Int64 // UnixNano of the last Recompute, 0 before it

	mu      sync.Mutex              // serialises Apply, Recompute and Snapshot
	levels  map[levelKey]*level     // by mu: the levels of the current config
	retired map[levelKey]*level     // by mu: gone from the config, connections open
	last    time.Time               // by mu: the previous Recompute
	order   []*level                // by mu: retired levels, for Recompute
	scratch map[*level]struct{}     // by mu: Apply's dedup set
	defCap  int64                   // by mu: the capacity of a level Apply creates (noCapacity: none)
	tables  map[string]*clientTable // by mu: client tables by scope ("" the instance, else "vs:"+name)

	// shareUntil, when set, is when the shares stop counting (see
	// SetShareDeadline).
	shareUntil atomic.Pointer[time.Time]

	// arb, when set, shares the clients' counts cluster-wide
	// (SetClientArbiter); clientSeq orders the counts it is told.
	arb       atomic.Pointer[arbiterBox]
	clientSeq atomic.Int64
}

// noCapacity is a level's capacity when no share is set: the limit alone
// counts.
const noCapacity = math.MaxInt64

type levelKey struct {
	kind LevelKind
	name string
}

// keyOf is a level's key: the instance level is found by kind alone.
func keyOf(kind LevelKind, name string) levelKey {
	if kind == LevelInstance {
		name = ""
	}
	return levelKey{kind, name}
}

// admState is one applied configuration: immutable once stored.
type admState struct {
	byVS   map[*VirtualServer]*chain
	byName map[string]*chain
	inst   *chain   // the instance alone: for a service the config lacks
	levels []link   // every level once, instance, classes, virtual servers
	chains []*chain // one per virtual server, in config order: Recompute's byte feed
	// instClients is the instance's client table, nil without
	// instance clientLimits.
	instClients *clientTable
}

// chain is the levels a connection to one virtual server is checked and
// counted at, innermost first, with the limits of the config it was built for.
//
// held counts the tickets that hold the chain. When a reload builds a new
// chain for the same virtual server, Apply points moved at it and sets the
// frozen bit in held: the connections held then are moved to the new
// chain's levels (a virtual server that changed class is counted on its new
// class at once, not on the old one until its connections close), and a
// ticket that finds its chain frozen follows moved. Admit and Release never
// lock: they change held with a compare-and-swap that fails once it is
// frozen.
type chain struct {
	links []link
	held  atomic.Int64
	moved atomic.Pointer[chain]
	// clients is the virtual server's client table, nil without
	// clientLimits.
	clients *clientTable
}

// frozen is subtracted from chain.held to mark the chain replaced: a held
// count below -frozen/2 is frozen. (A count, not a bit: the replacement's
// count can dip below zero for a moment, when a ticket that followed moved
// releases before Apply has added the moved connections to it.)
const frozen = 1 << 62

func isFrozen(h int64) bool { return h < -frozen/2 }

// hold adds one ticket to c, following replaced chains: a connection counted
// on a chain frozen meanwhile moves its count to the replacement's levels.
// It returns the chain that holds the ticket.
func (c *chain) hold() *chain {
	for {
		h := c.held.Load()
		if isFrozen(h) {
			nc := c.moved.Load()
			moveConns(c, nc, 1)
			c = nc
			continue
		}
		if c.held.CompareAndSwap(h, h+1) {
			return c
		}
	}
}

// release removes one ticket from c or the chain that replaced it, and
// uncounts it at that chain's levels.
func (c *chain) release() {
	for {
		h := c.held.Load()
		if isFrozen(h) {
			c = c.moved.Load()
			continue
		}
		if c.held.CompareAndSwap(h, h-1) {
			for i := range c.links {
				lv := c.links[i].lvl
				lv.conns.Add(-1)
				if lv.q.n.Load() > 0 {
					lv.q.wakeHead()
				}
			}
			return
		}
	}
}

// replace freezes c and moves the connections it holds to nc (not yet
// published), at the levels the two chains do not share. Under
// Admission.mu.
func (c *chain) replace(nc *chain) {
	c.moved.Store(nc)
	for {
		h := c.held.Load()
		if isFrozen(h) {
			return // replaced before
		}
		if c.held.CompareAndSwap(h, h-frozen) {
			moveConns(c, nc, h)
			nc.held.Add(h)
			return
		}
	}
}

// moveConns moves n connections from the levels of from to those of to,
// leaving the levels both chains share alone.
func moveConns(from, to *chain, n int64) {
	if n == 0 {
		return
	}
	for i := range to.links {
		if !from.has(to.links[i].lvl) {
			to.links[i].lvl.conns.Add(n)
		}
	}
	for i := range from.links {
		if !to.has(from.links[i].lvl) {
			from.links[i].lvl.conns.Add(-n)
		}
	}
}

func (c *chain) has(lv *level) bool {
	for i := range c.links {
		if c.links[i].lvl == lv {
			return true
		}
	}
	return false
}

type link struct {
	lvl  *level
	name string // the level's name in this config (the instance may be renamed)
	lim  Limits
	// skip is what this chain does not check here, because the chain's
	// virtual server overrides it (skipConns, skipBandwidth): the level
	// still counts the connection and its bytes.
	skip uint8
}

const (
	skipConns     uint8 = 1 << iota // the virtual server sets maxConnections
	skipBandwidth                   // the virtual server sets maxBandwidth (and its burst)
)

// level is the statistics of one level; it outlives configurations.
type level struct {
	kind LevelKind
	name string // the name it was created with; immutable

	conns  atomic.Int64  // open connections, exact
	bytes  atomic.Uint64 // running byte total
	rate   atomic.Int64  // bytes per second judged (local + remote), published by Recompute
	tokens atomic.Int64  // burst bucket, published by Recompute
	// local is this instance's own window rate, published by Recompute;
	// remote is the other instances' (SetRemoteBandwidth), added to it
	// at each Recompute: rate = local + remote.
	local, remote atomic.Int64
	// remoteConns is the other instances' open connections at a level
	// whose maxConnections is only logged (SetRemoteConns): the log line
	// says when the cluster's sum crosses it.
	remoteConns atomic.Int64

	overConns, overBW, overBurst atomic.Bool // the state the last event reported

	// q is the level's queue (Limits.Queue), qc its counters.
	q  waitQueue
	qc queueCounters

	// capacity is this instance's share of an enforced MaxConnections that
	// is cluster-wide (see SetCapacity), noCapacity when there is none.
	// Admit increments conns and then reads capacity; SetCapacity stores
	// capacity and then reads conns: with sequentially consistent atomics
	// one of the two sees the other, so the count SetCapacity returns bounds
	// every connection admitted under the old share.
	capacity atomic.Int64
	// shareRefused counts the connections refused by the share, below the
	// limit: the demand the share did not meet.
	shareRefused atomic.Uint64

	// By Admission.mu.
	fed          uint64 // virtual servers: the ByteTotals total already added
	win          *Window
	winMetric    time.Duration
	winRecompute time.Duration
	bucketOn     bool
	bucket       int64  // bytes left, ≥ −BurstBytes
	bucketFrac   uint64 // refill remainder, in byte·ns/s
	bucketLast   uint64 // byte total at the previous refill
}

// NewAdmission returns the admission state for cfg (which must be compiled),
// with room for events Events (≤ 0: DefaultEventBuffer).
func NewAdmission(cfg *Config, events int) *Admission {
	if events <= 0 {
		events = DefaultEventBuffer
	}
	a := &Admission{
		events:  make(chan Event, events),
		defCap:  noCapacity,
		levels:  make(map[levelKey]*level),
		retired: make(map[levelKey]*level),
		scratch: make(map[*level]struct{}),
		tables:  make(map[string]*clientTable),
	}
	a.Apply(cfg)
	return a
}

// Apply makes cfg's limits the ones Admit checks, atomically: an Admit sees
// either the old limits at every level or the new ones at every level. The
// statistics of every level whose name is still present carry over (the
// instance's always do); a level's bandwidth window restarts only if the
// metric or recompute interval changed. cfg must be compiled.
func (a *Admission) Apply(cfg *Config) {
	a.mu.Lock()
	defer a.mu.Unlock()
	mi, ri := cfg.Instance.MetricInterval, cfg.Instance.RecomputeInterval
	fresh := make(map[levelKey]*level, len(a.levels))
	get := func(kind LevelKind, name string) *level {
		k := keyOf(kind, name)
		lv := fresh[k]
		if lv == nil {
			lv = a.levels[k]
			if lv == nil {
				lv = a.retired[k]
				delete(a.retired, k)
			}
			if lv == nil {
				lv = &level{kind: kind, name: name}
				lv.q.c = &lv.qc
				lv.capacity.Store(a.defCap)
			}
			fresh[k] = lv
		}
		if lv.win == nil || lv.winMetric != mi || lv.winRecompute != ri {
			lv.win, lv.winMetric, lv.winRecompute = NewWindow(mi, ri), mi, ri
			// Count from the level's bytes now, so that traffic before the
			// first Recompute is credited (a new level starts at 0).
			lv.win.Start(lv.bytes.Load())
		}
		return lv
	}
	st := &admState{
		byVS:   make(map[*VirtualServer]*chain, len(cfg.Services)),
		byName: make(map[string]*chain, len(cfg.Services)),
	}
	clear(a.scratch)
	add := func(l link) {
		if _, dup := a.scratch[l.lvl]; !dup {
			a.scratch[l.lvl] = struct{}{}
			st.levels = append(st.levels, l)
			l.lvl.applyBurst(l.lim)
		}
	}
	fresh2 := make(map[string]*clientTable)
	table := func(scope string, cl ClientLimits) *clientTable {
		if !cl.Any() {
			return nil
		}
		k := "vs:" + scope
		if scope == "" {
			k = ""
		}
		t := a.tables[k]
		if t == nil {
			t = newClientTable(a, scope)
		}
		t.apply(cl, mi)
		fresh2[k] = t
		return t
	}
	st.instClients = table("", cfg.Instance.ClientLimits)
	inst := link{get(LevelInstance, cfg.Instance.Name), cfg.Instance.Name, cfg.Instance.Limits, 0}
	st.inst = &chain{links: []link{inst}}
	add(inst)
	for _, cl := range cfg.Classes {
		add(link{get(LevelClass, cl.Name), cl.Name, cl.Limits, 0})
	}
	for _, vs := range cfg.Services {
		c := &chain{links: []link{{get(LevelVirtualServer, vs.Name), vs.Name, vs.Limits, 0}}, clients: table(vs.Name, vs.ClientLimits)}
	chain:
		for cl := vs.Class; cl != nil; cl = cl.Parent {
			lv := get(LevelClass, cl.Name)
			for _, l := range c.links {
				if l.lvl == lv { // a loop Compile could not see (a class not in cfg.Classes)
					break chain
				}
			}
			c.links = append(c.links, link{lv, cl.Name, cl.Limits, 0})
		}
		c.links = append(c.links, inst)
		for _, l := range c.links {
			add(l)
		}
		// The virtual server's own limits override its classes' and the
		// instance's for its connections (see Override above).
		var skip uint8
		if vs.Limits.MaxConnections > 0 {
			skip |= skipConns
		}
		if vs.Limits.MaxBandwidth > 0 {
			skip |= skipBandwidth
		}
		for i := 1; i < len(c.links); i++ {
			c.links[i].skip = skip
		}
		st.byVS[vs] = c
		st.byName[vs.Name] = c
		st.chains = append(st.chains, c)
	}
	// Move the open connections of every virtual server still present to
	// its new chain, before the retired levels are worked out: a class left
	// by its last virtual server is then empty and not kept.
	if old := a.st.Load(); old != nil {
		for _, oc := range old.chains {
			if nc := st.byName[oc.links[0].name]; nc != nil {
				oc.replace(nc)
			}
		}
	}
	for k, lv := range a.levels {
		if fresh[k] == nil && lv.conns.Load() > 0 {
			a.retired[k] = lv
		}
	}
	a.order = a.order[:0]
	for k, lv := range a.retired {
		if lv.conns.Load() <= 0 {
			delete(a.retired, k)
			continue
		}
		a.order = append(a.order, lv)
	}
	a.levels = fresh
	// A table gone from the config is dropped: the tickets that hold its
	// entries release them on it; a later config starts it anew.
	a.tables = fresh2
	a.st.Store(st)
	// A limit raised, or a queue gone, may have room for those waiting.
	for _, l := range st.levels {
		l.lvl.q.wakeHead()
	}
}

// applyBurst starts, resizes or stops lv's burst bucket for lim. Under mu.
func (lv *level) applyBurst(lim Limits) {
	on := lim.BurstBytes > 0 && lim.MaxBandwidth > 0
	switch {
	case on && !lv.bucketOn:
		lv.bucket, lv.bucketFrac, lv.bucketLast = lim.BurstBytes, 0, lv.bytes.Load()
	case on && lv.bucket > lim.BurstBytes:
		lv.bucket = lim.BurstBytes
	case on && lv.bucket < -lim.BurstBytes:
		lv.bucket = -lim.BurstBytes
	}
	lv.bucketOn = on
	lv.tokens.Store(lv.bucket)
}

// Ticket is one admitted connection: the levels it is counted at. The zero
// value holds nothing. Keep it where the connection lives (it must not be
// copied after Admit) and call Release when the connection closes.
type Ticket struct {
	c atomic.Pointer[chain]
	// The client entries the connection is counted at (the virtual
	// server's, the instance's), written before c is stored.
	cl [2]clientHold
}

type clientHold struct {
	t *clientTable
	e *clientEntry
}

// Admitted reports whether t holds a connection not yet released.
func (t *Ticket) Admitted() bool { return t.c.Load() != nil }

// Release uncounts the connection at every level it was counted at, exactly
// once: later calls, and calls on a zero Ticket, do nothing. It is safe to
// call concurrently and after any number of reloads; the levels are the ones
// Admit counted, which by name are the ones the current config checks.
func (t *Ticket) Release() {
	if t.c.Load() == nil {
		return
	}
	c := t.c.Swap(nil)
	if c == nil {
		return
	}
	t.releaseClients()
	c.release()
}

func (t *Ticket) releaseClients() {
	for i := range t.cl {
		if h := t.cl[i]; h.e != nil {
			h.t.release(h.e)
		}
	}
}

// AddBytes counts n bytes of the connection's own traffic at every level t
// holds, at once: the bytes of an http request, which the proxy reports as
// they move (the datapath meters the client connection as a whole, see
// ByteTotals). It does nothing once t is released. It takes no lock and does
// not allocate.
func (t *Ticket) AddBytes(n uint64) {
	c := t.c.Load()
	if c == nil || n == 0 {
		return
	}
	for isFrozen(c.held.Load()) {
		c = c.moved.Load() // counted on the chain its connection moved to
	}
	c.addBytes(n)
	t.addClientBytes(n)
}

// AddClientBytes counts n bytes of the connection's traffic at its
// clients only (the per-client bandwidth): a tcp connection's bytes, which
// reach the levels through Recompute's ByteTotals. It does nothing once t
// is released.
func (t *Ticket) AddClientBytes(n uint64) {
	if t.c.Load() == nil || n == 0 {
		return
	}
	t.addClientBytes(n)
}

func (t *Ticket) addClientBytes(n uint64) {
	for i := range t.cl {
		if h := t.cl[i]; h.e != nil {
			h.e.addBytes(h.t.slotNow(), n)
		}
	}
}

func (c *chain) addBytes(n uint64) {
	for i := range c.links {
		c.links[i].lvl.bytes.Add(n)
	}
}

// chain returns the levels for vs in st: by pointer, else by name (vs from an
// older config), else the instance alone.
func (st *admState) chain(vs *VirtualServer) *chain {
	if vs == nil {
		return st.inst
	}
	if c := st.byVS[vs]; c != nil {
		return c
	}
	if c := st.byName[vs.Name]; c != nil {
		return c
	}
	return st.inst
}

// Admit decides whether a new connection to vs may open. It checks the
// virtual server, then its class and the class's parents, then the instance;
// at each level bandwidth, then the burst bucket, then connections. An
// enforced limit that is over refuses: Admit returns the Refusal and false,
// and no level keeps a count. Otherwise every level counts the connection,
// t holds it until Release, and Admit returns true. A limit that is not
// enforced never refuses (see Event).
//
// vs may come from an older config: it is matched by name. A virtual server
// the current config lacks (or nil) is checked and counted at the instance
// only. If t still holds a connection, that one is released first. Admit
// takes no lock and does not allocate; a level's connection count never
// exceeds an enforced MaxConnections, however many goroutines admit at once,
// except by the connections of members that override it (see Override),
// which it counts but does not judge.
//
// A refusal names the limit that refused first and every other enforced
// limit over at that moment (Refusal.Also), the rest of that level's and
// those of the levels after it.
func (a *Admission) Admit(vs *VirtualServer, t *Ticket) (Refusal, bool) {
	return a.admitClient(vs, netip.Addr{}, t, nil)
}

// AdmitClient is Admit for a connection of client: the virtual server's
// and the instance's per-client limits (ClientLimits) are checked first.
// The zero Addr skips them.
func (a *Admission) AdmitClient(vs *VirtualServer, client netip.Addr, t *Ticket) (Refusal, bool) {
	return a.admitClient(vs, client, t, nil)
}

// admitClient is AdmitClient for a caller at the head of queue head (Wait):
// that queue does not hold it back.
func (a *Admission) admitClient(vs *VirtualServer, client netip.Addr, t *Ticket, head *waitQueue) (Refusal, bool) {
	t.Release()
	st := a.st.Load()
	c := st.chain(vs)
	t.cl = [2]clientHold{}
	if client.IsValid() {
		for i, ct := range [2]*clientTable{c.clients, st.instClients} {
			if ct == nil {
				continue
			}
			var r Refusal
			e, ask, ok := ct.acquire(client, head, &r)
			if e != nil {
				t.cl[i] = clientHold{ct, e}
			}
			if ok && ask.n > 0 {
				ok = a.askArbiter(ct.scope, ask, &r)
			}
			if !ok {
				t.releaseClients()
				t.cl = [2]clientHold{}
				return r, false
			}
		}
	}
	for i := range c.links {
		if o, ok := a.admitAt(&c.links[i], head); !ok {
			for j := 0; j < i; j++ {
				c.links[j].lvl.conns.Add(-1)
			}
			t.releaseClients()
			t.cl = [2]clientHold{}
			r := Refusal{Over: o}
			if l := &c.links[i]; o.Limit == LimitMaxConnections && l.lim.queued() {
				r.q, r.qmax, r.qtimeout = &l.lvl.q, l.lim.Queue, l.lim.queueTimeout()
				r.qwaiting = l.lvl.q.n.Load()
			}
			// Name every other limit over: the rest of this level's and
			// those of the levels after it (the levels before it were
			// under).
			for j := i; j < len(c.links); j++ {
				c.links[j].overs(&r, o.Limit, j == i)
			}
			return r, false
		}
	}
	t.c.Store(c.hold())
	return Refusal{}, true
}

// overs adds to r the enforced limits over at l, as admitAt judges them
// but without counting anything; at the refusing level (first) the limit
// that refused (done) is already r's first and the connection check is
// the one it made, so only the limits before it are read again.
func (l *link) overs(r *Refusal, done LimitKind, first bool) {
	lv, lim, name := l.lvl, &l.lim, l.name
	if lim.MaxBandwidth > 0 && lim.EnforceBandwidth && l.skip&skipBandwidth == 0 {
		if first && done == LimitMaxBandwidth {
			// refused here; the burst bucket may be empty as well
		} else if rate := lv.rate.Load(); rate >= lim.MaxBandwidth {
			r.add(Over{Level: lv.kind, Name: name, Limit: LimitMaxBandwidth, Value: lim.MaxBandwidth, Measured: rate})
		}
		if first && done == LimitBurst {
			return // refused by the burst: connections were not checked
		}
		if lim.BurstBytes > 0 {
			if tok := lv.tokens.Load(); tok <= 0 {
				r.add(Over{Level: lv.kind, Name: name, Limit: LimitBurst, Value: lim.BurstBytes, Measured: tok})
			}
		}
	}
	if first && done == LimitMaxConnections {
		return
	}
	if lim.MaxConnections > 0 && lim.EnforceConnections && l.skip&skipConns == 0 {
		n := lv.conns.Load()
		if n >= lim.MaxConnections {
			r.add(Over{Level: lv.kind, Name: name, Limit: LimitMaxConnections, Value: lim.MaxConnections, Measured: n})
		} else if share := lv.capacity.Load(); n >= share {
			r.add(Over{Level: lv.kind, Name: name, Limit: LimitMaxConnections, Value: lim.MaxConnections, Measured: n, Shared: true, Share: share})
		}
	}
}

// admitAt checks one level and counts the connection there.
func (a *Admission) admitAt(l *link, head *waitQueue) (Over, bool) {
	lv, lim, name := l.lvl, &l.lim, l.name
	if lim.MaxBandwidth > 0 && lim.EnforceBandwidth && l.skip&skipBandwidth == 0 {
		// Sun: "additional connections are refused, once the server
		// reaches its bandwidth limit": at the limit, as connections are.
		if r := lv.rate.Load(); r >= lim.MaxBandwidth {
			return Over{Level: lv.kind, Name: name, Limit: LimitMaxBandwidth, Value: lim.MaxBandwidth, Measured: r}, false
		}
		if lim.BurstBytes > 0 {
			if tok := lv.tokens.Load(); tok <= 0 {
				return Over{Level: lv.kind, Name: name, Limit: LimitBurst, Value: lim.BurstBytes, Measured: tok}, false
			}
		}
	}
	if lim.MaxConnections > 0 && lim.EnforceConnections && l.skip&skipConns == 0 {
		if lim.Queue > 0 && lv.q.n.Load() > 0 && head != &lv.q {
			// First in, first out: a freed slot is the queue's head's.
			return Over{Level: lv.kind, Name: name, Limit: LimitMaxConnections, Value: lim.MaxConnections, Measured: lv.conns.Load()}, false
		}
		for {
			n := lv.conns.Load()
			if n >= lim.MaxConnections {
				return Over{Level: lv.kind, Name: name, Limit: LimitMaxConnections, Value: lim.MaxConnections, Measured: n}, false
			}
			share := lv.capacity.Load()
			if share != noCapacity && a.sharesExpired() {
				share = 0
			}
			if n >= share {
				lv.shareRefused.Add(1)
				return Over{Level: lv.kind, Name: name, Limit: LimitMaxConnections, Value: lim.MaxConnections, Measured: n, Shared: true, Share: share}, false
			}
			if lv.conns.CompareAndSwap(n, n+1) {
				// A SetCapacity that shrank the share meanwhile either
				// sees this connection or is seen here.
				if now := lv.capacity.Load(); now != share && n+1 > now {
					lv.conns.Add(-1)
					lv.shareRefused.Add(1)
					return Over{Level: lv.kind, Name: name, Limit: LimitMaxConnections, Value: lim.MaxConnections, Measured: n, Shared: true, Share: now}, false
				}
				return Over{}, true
			}
		}
	}
	n := lv.conns.Add(1)
	if lim.MaxConnections > 0 {
		n += lv.remoteConns.Load()
	}
	if lim.MaxConnections > 0 && n > lim.MaxConnections && !lv.overConns.Load() && lv.overConns.CompareAndSwap(false, true) {
		a.emit(Event{At: a.lastRecompute(), Level: lv.kind, Name: name, Limit: LimitMaxConnections,
			Value: lim.MaxConnections, Measured: n, Over: true, Enforced: lim.EnforceConnections})
	}
	return Over{}, true
}

func (a *Admission) lastRecompute() time.Time {
	if ns := a.now.Load(); ns != 0 {
		return time.Unix(0, ns)
	}
	return time.Time{}
}

// emit queues e for the control plane, or counts it as dropped when the
// buffer is full. It never blocks.
func (a *Admission) emit(e Event) {
	select {
	case a.events <- e:
	default:
		a.dropped.Add(1)
	}
}

// Events returns the channel the control plane drains. It is buffered (see
// NewAdmission); an event that finds it full is dropped and counted in
// DroppedEvents.
func (a *Admission) Events() <-chan Event { return a.events }

// DroppedEvents returns the number of events dropped because the buffer was
// full.
func (a *Admission) DroppedEvents() uint64 { return a.dropped.Load() }

// ByteTotals is where Recompute reads traffic: the running byte total
// (both directions) of each virtual server, by name, false for a name it
// does not know. The datapath's meters satisfy it (datapath.Engine and
// datapath.Meters); a total must not go back, and one that does counts as
// a fresh start (its bytes are all new). Recompute calls it from its own
// goroutine, once per virtual server per step; it must not block.
type ByteTotals interface {
	ServiceBytes(name string) (total uint64, ok bool)
}

// Recompute is the bandwidth manager's step, called every RecomputeInterval
// by one goroutine with the current time and the byte totals: it adds each
// virtual server's new bytes to its levels, ticks every level's window with
// the level's byte total, refills the burst buckets, publishes the rates
// that Admit reads, and emits an Event for every limit crossed since the
// previous call. bytes may be nil (no traffic is metered). It does not
// allocate.
//
// The burst guard (Limits.BurstBytes > 0 with MaxBandwidth > 0, off by
// default) is a token bucket of BurstBytes bytes, full at start, refilled at
// MaxBandwidth bytes per second and drained by the level's traffic; while it
// is empty (≤ 0) an enforced level refuses new connections. It closes the
// seed's hole where, after a window of idleness, the average lets a client
// use 30 times the limit for a second. The bucket's debt is bounded by
// BurstBytes, so after a long transfer new connections wait at most
// BurstBytes/MaxBandwidth seconds longer than the traffic lasted. Like the
// window, it sees traffic once per recompute interval.
func (a *Admission) Recompute(now time.Time, bytes ByteTotals) {
	a.mu.Lock()
	defer a.mu.Unlock()
	st := a.st.Load()
	if bytes != nil {
		for _, c := range st.chains {
			vs := c.links[0] // a chain starts at its virtual server
			total, ok := bytes.ServiceBytes(vs.name)
			if !ok {
				continue
			}
			n := total - vs.lvl.fed
			if total < vs.lvl.fed {
				n = total // the source started over
			}
			vs.lvl.fed = total
			if n > 0 {
				c.addBytes(n)
			}
		}
	}
	var dt time.Duration
	if !a.last.IsZero() && now.After(a.last) {
		dt = now.Sub(a.last)
	}
	a.last = now
	a.now.Store(now.UnixNano())
	for _, l := range st.levels {
		a.recomputeLevel(now, dt, l)
	}
	for _, lv := range a.order {
		lv.win.Tick(now, lv.bytes.Load())
		local := lv.win.Rate()
		lv.local.Store(local)
		lv.rate.Store(satAdd(local, lv.remote.Load()))
	}
}

// satAdd is a + b for rates ≥ 0, saturating instead of wrapping.
func satAdd(a, b int64) int64 {
	if s := a + b; s >= a {
		return s
	}
	return math.MaxInt64
}

func (a *Admission) recomputeLevel(now time.Time, dt time.Duration, l link) {
	lv, lim := l.lvl, l.lim
	total := lv.bytes.Load()
	lv.win.Tick(now, total)
	local := lv.win.Rate()
	lv.local.Store(local)
	rate := satAdd(local, lv.remote.Load())
	lv.rate.Store(rate)
	if lv.bucketOn {
		hi, lo := bits.Mul64(uint64(lim.MaxBandwidth), uint64(dt))
		lo, carry := bits.Add64(lo, lv.bucketFrac, 0)
		hi += carry
		var refill uint64
		if hi < uint64(time.Second) {
			refill, lv.bucketFrac = bits.Div64(hi, lo, uint64(time.Second))
		} else {
			refill, lv.bucketFrac = uint64(lim.BurstBytes)*2, 0
		}
		used := total - lv.bucketLast
		lv.bucketLast = total
		b := lv.bucket
		if refill >= uint64(lim.BurstBytes-b) {
			b = lim.BurstBytes
		} else {
			b += int64(refill)
		}
		if used >= uint64(b+lim.BurstBytes) {
			b = -lim.BurstBytes
		} else {
			b -= int64(used)
		}
		lv.bucket = b
		lv.tokens.Store(b)
	}
	at := func(k LimitKind, value, measured int64, over bool, enforced bool) {
		a.emit(Event{At: now, Level: lv.kind, Name: l.name, Limit: k, Value: value, Measured: measured,
			Over: over, Enforced: enforced})
	}
	n := lv.conns.Load()
	if !lim.EnforceConnections {
		n += lv.remoteConns.Load() // a logged limit: the cluster's sum
	}
	over := lim.MaxConnections > 0 && n > lim.MaxConnections
	if lv.overConns.Load() != over && lv.overConns.CompareAndSwap(!over, over) {
		at(LimitMaxConnections, lim.MaxConnections, n, over, lim.EnforceConnections)
	}
	over = lim.MaxBandwidth > 0 && rate > lim.MaxBandwidth
	if lv.overBW.Swap(over) != over {
		at(LimitMaxBandwidth, lim.MaxBandwidth, rate, over, lim.EnforceBandwidth)
	}
	tok := lv.tokens.Load()
	over = lv.bucketOn && tok <= 0
	if lv.overBurst.Swap(over) != over {
		at(LimitBurst, lim.BurstBytes, tok, over, lim.EnforceBandwidth)
	}
}

// LevelStat is one level's state for the admin API.
type LevelStat struct {
	Level  LevelKind
	Name   string
	Limits Limits // zero for a retired level
	// Conns is the number of open connections.
	Conns int64
	// Bytes is the running total of bytes counted at the level.
	Bytes uint64
	// Bandwidth is the window's rate in bytes per second as of the last
	// Recompute, the one the limit is judged on: cluster-wide when the
	// instances share their bandwidth (SetRemoteBandwidth), else
	// LocalBandwidth.
	Bandwidth int64
	// LocalBandwidth is this instance's own window rate; RemoteBandwidth
	// the other instances' as last set.
	LocalBandwidth, RemoteBandwidth int64
	// RemoteConns is the other instances' open connections as last set
	// (SetRemoteConns), counted in the crossing events of a logged
	// maxConnections.
	RemoteConns int64
	// BurstTokens is the bytes left in the burst bucket; meaningful only
	// when Limits.BurstBytes and Limits.MaxBandwidth are set.
	BurstTokens int64
	// OverConns, OverBandwidth and OverBurst are the states the events last
	// reported.
	OverConns, OverBandwidth, OverBurst bool
	// Retired: the level is gone from the config but still has open
	// connections.
	Retired bool
	// Capacity is this instance's share of an enforced MaxConnections that
	// is cluster-wide (SetCapacity), -1 when none is set.
	Capacity int64
	// ShareRefused counts the connections refused by the share below the
	// limit.
	ShareRefused uint64
	// Queue is the level's queue (Limits.Queue); zero without one.
	Queue QueueStat
}

// Snapshot returns every level's state: the instance, the classes, the
// virtual servers, then the retired levels.
func (a *Admission) Snapshot() []LevelStat {
	a.mu.Lock()
	defer a.mu.Unlock()
	st := a.st.Load()
	out := make([]LevelStat, 0, len(st.levels)+len(a.order))
	for _, l := range st.levels {
		s := l.lvl.stat(l.name, l.lim, false)
		s.Queue = l.lvl.qc.stat(l.lim)
		out = append(out, s)
	}
	for _, lv := range a.order {
		out = append(out, lv.stat(lv.name, Limits{}, true))
	}
	return out
}

func (lv *level) stat(name string, lim Limits, retired bool) LevelStat {
	return LevelStat{
		Level: lv.kind, Name: name, Limits: lim,
		Conns: lv.conns.Load(), Bytes: lv.bytes.Load(), Bandwidth: lv.rate.Load(), BurstTokens: lv.tokens.Load(),
		LocalBandwidth: lv.local.Load(), RemoteBandwidth: lv.remote.Load(), RemoteConns: lv.remoteConns.Load(),
		OverConns: lv.overConns.Load(), OverBandwidth: lv.overBW.Load(), OverBurst: lv.overBurst.Load(),
		Retired: retired, Capacity: capOut(lv.capacity.Load()), ShareRefused: lv.shareRefused.Load(),
	}
}

func capOut(c int64) int64 {
	if c == noCapacity {
		return -1
	}
	return c
}

// SetCapacity sets this instance's share of the enforced connection limit
// at one level, for a limit that several instances share (the cluster
// package holds the slots): Admit then refuses at min(MaxConnections, c)
// open connections, with a Refusal that says Shared. c < 0 removes the
// share (the limit alone counts). The instance level is found by kind
// alone. It returns the level's open connections read after the share took
// effect: no connection admitted before the call, under a larger share, is
// missing from it, so max(c, open) bounds the connections the level can
// hold from now on. ok is false when the current config has no such level.
// Control plane only (it takes the mutex Apply holds).
func (a *Admission) SetCapacity(kind LevelKind, name string, c int64) (open int64, ok bool) {
	if c < 0 {
		c = noCapacity
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	lv := a.levels[keyOf(kind, name)]
	if lv == nil {
		return 0, false
	}
	lv.capacity.Store(c)
	return lv.conns.Load(), true
}

// SetRemoteBandwidth sets the other instances' bandwidth at one level, in
// bytes per second over their metric windows (the cluster package sums
// what they publish), for a level whose maxBandwidth several instances
// share: from the next Recompute on, the level is judged (refused, or
// logged) on its own window rate plus bps. bps < 0 counts as 0. The
// instance level is found by kind alone. ok is false when the current
// config has no such level. The burst bucket stays local. Control plane
// only.
func (a *Admission) SetRemoteBandwidth(kind LevelKind, name string, bps int64) (ok bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	lv := a.levels[keyOf(kind, name)]
	if lv == nil {
		return false
	}
	lv.remote.Store(max(bps, 0))
	// Judged on the new sum at once, not a recompute interval later; the
	// crossing is logged at the next Recompute.
	lv.rate.Store(satAdd(lv.local.Load(), max(bps, 0)))
	return true
}

// SetRemoteConns sets the other instances' open connections at one level
// whose maxConnections is only logged (an enforced one is shared exactly
// by SetCapacity): the crossing events, and so the log lines, then count
// the cluster's sum, this instance's connections plus n. n < 0 counts as
// 0. ok is false when the current config has no such level. Control plane
// only.
func (a *Admission) SetRemoteConns(kind LevelKind, name string, n int64) (ok bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	lv := a.levels[keyOf(kind, name)]
	if lv == nil {
		return false
	}
	lv.remoteConns.Store(max(n, 0))
	return true
}

// SetShareDeadline bounds the shares set by SetCapacity in time: once d
// has passed (on the monotonic clock of a time.Now value), every level
// with a share admits as if its share were 0, until the next call. The
// cluster sets it to the end of the lease its shares stand on, so that an
// instance that could not renew it in time (a paused process) does not
// admit on it, whatever runs first when it resumes. A zero d removes the
// deadline. Safe from any goroutine.
func (a *Admission) SetShareDeadline(d time.Time) {
	if d.IsZero() {
		a.shareUntil.Store(nil)
		return
	}
	a.shareUntil.Store(&d)
}

func (a *Admission) sharesExpired() bool {
	d := a.shareUntil.Load()
	return d != nil && time.Now().After(*d)
}

// SetDefaultCapacity sets the share of every level, present, retired and
// created by a later Apply, to c (< 0: none, the default). The cluster sets
// 0 before it takes its first slots, so that a level an instance holds no
// lease for admits nothing at an enforced connection limit. Control plane
// only.
func (a *Admission) SetDefaultCapacity(c int64) {
	if c < 0 {
		c = noCapacity
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.defCap = c
	for _, lv := range a.levels {
		lv.capacity.Store(c)
	}
	for _, lv := range a.retired {
		lv.capacity.Store(c)
	}
}
