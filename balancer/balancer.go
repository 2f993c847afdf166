package balancer

// PickAction flow (every new connection):
//
//	table ← atomic load                  the immutable table of this moment
//	      → its level for the connection's policy action, if it has one
//	fast path by algorithm over primaries that are up, weighted and not tried:
//	  round robin   cursor ← atomic add; its schedule entry, else random ones
//	  least-conn    ≤ 32 primaries: scan for the least open/weight, ties to the
//	                schedule's pick; more: the better of the schedule's pick
//	                and a sampled schedule entry (power of two choices)
//	  Maglev        lookup[flowHash mod M], else entries at re-hashed slots
//	  each candidate: slow-start thinning, then a CAS on its open count
//	                bounded by MaxConnections (full: SkippedAtLimit++)
//	every primary once, from a rotating start (no slow-start thinning)
//	primaries the QoS cut to weight 0, once each
//	backups in configured order: the first that is up and under its limit
//	targets configured with weight 0 (draining): never
//	none: *NoTargetError naming each target and why (allocates; refusal only)

import (
	"sync"
	"sync/atomic"
	"time"

	"weir/policy"
)

// Balancer distributes one virtual server's new connections over its targets.
// PickAction, Lease methods and Snapshot may be called from any goroutine; Update,
// SetWeights and ReportHealth may too, and are serialised among themselves.
type Balancer struct {
	tab     atomic.Pointer[table]
	refused atomic.Uint64 // picks that returned *NoTargetError

	mu sync.Mutex // guards the fields below; PickAction never takes it
	// states holds live state by target name: every target of the current
	// table, plus removed targets that still have open connections, so a
	// target that comes back finds its count.
	states map[string]*targetState
	// eff holds the default level's balancing weights set by SetWeights or
	// SetFractions, by name, with the base weight they were computed from (a
	// reload that changes the base drops them); levels holds the same per
	// policy action name.
	eff    map[string]effWeight
	levels map[string]map[string]effWeight
	// defCap is the share a target gets when it joins (SetDefaultCapacity).
	defCap int64

	// onEject, when set, hears each ejection once (OnEject).
	onEject atomic.Pointer[func(Ejection)]
}

// effWeight is a balancing weight in hundredths of a WLM weight
// (policy.ExactWeight) and the base weight it was computed from.
type effWeight struct{ units, base int }

// New builds a balancer for vs with settings s. Both come from a Config
// passed through policy.Compile, which fills the defaults and checks what
// PickAction relies on (target names present and unique, weights not
// negative, MaxAttempts within 1..MaxTried); the balancer does not repeat
// it, so building one and reloading it (Update) cannot fail.
func New(vs *policy.VirtualServer, s policy.BalancerSettings) *Balancer {
	b := &Balancer{states: map[string]*targetState{}, eff: map[string]effWeight{}, levels: map[string]map[string]effWeight{},
		defCap: noCapacity}
	b.Update(vs, s)
	return b
}

// Update swaps in a new configuration of the virtual server (a reload),
// compiled like New's. Targets are matched by name: open connections,
// down-state, health and counters carry over, and leases taken before the
// swap release correctly after it. Effective weights from SetWeights carry
// over for targets whose base weight did not change.
func (b *Balancer) Update(vs *policy.VirtualServer, s policy.BalancerSettings) {
	seen := make(map[string]bool, len(vs.Targets))
	for _, t := range vs.Targets {
		seen[t.Name] = true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, t := range vs.Targets {
		if b.states[t.Name] == nil {
			st := &targetState{name: t.Name}
			st.capacity.Store(b.defCap)
			b.states[t.Name] = st
		}
		if e, ok := b.eff[t.Name]; ok && e.base != t.Weight {
			delete(b.eff, t.Name)
		}
		for _, lv := range b.levels {
			if e, ok := lv[t.Name]; ok && e.base != t.Weight {
				delete(lv, t.Name)
			}
		}
	}
	for name, st := range b.states {
		// A pick racing this reload on the old table can still reserve on a
		// state dropped here; its lease then releases into that state, and a
		// target of the same name added later starts from a fresh count.
		if !seen[name] && st.open.Load() == 0 {
			delete(b.states, name)
			delete(b.eff, name)
			for _, lv := range b.levels {
				delete(lv, name)
			}
		}
	}
	if healthOf(vs, s).Interval <= 0 {
		// Health checks off: nothing will ever report these targets up
		// again, so forget what the checks said.
		for _, st := range b.states {
			st.mu.Lock()
			st.health = Health{}
			st.check = CheckStatus{}
			st.healthDown.Store(false)
			st.mu.Unlock()
		}
	}
	b.swap(vs, s)
}

// SetCapacity sets this instance's share of target's MaxConnections, for a
// limit that several instances share (the cluster holds the slots): PickAction
// then passes the target over at min(MaxConnections, c) open connections
// (SkippedAtShare). c < 0 removes the share; a target without
// MaxConnections ignores it. It returns the target's open connections read
// after the share took effect: no slot reserved before the call, under a
// larger share, is missing from it, so max(c, open) bounds the connections
// the target can hold here from now on. ok is false for an unknown target.
func (b *Balancer) SetCapacity(target string, c int64) (open int64, ok bool) {
	if c < 0 {
		c = noCapacity
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	st := b.states[target]
	if st == nil {
		return 0, false
	}
	st.capacity.Store(c)
	return st.open.Load(), true
}

// SetDefaultCapacity sets the share of every target, present and added by
// a later Update, to c (< 0: none, the default). The cluster sets 0 before
// it holds any slots, so that a target it holds no lease for takes no
// connection at a MaxConnections.
func (b *Balancer) SetDefaultCapacity(c int64) {
	if c < 0 {
		c = noCapacity
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.defCap = c
	for _, st := range b.states {
		st.capacity.Store(c)
	}
}

// MarkDown marks target down until until, as a failed connect does (slow
// start, if configured, ramps it from then), unless it is down longer
// already: the cluster shares the down-state another instance saw. ok is
// false for an unknown target.
func (b *Balancer) MarkDown(target string, until time.Time) (ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	st := b.states[target]
	if st == nil {
		return false
	}
	u := until.UnixNano()
	if u > st.downUntil.Load() {
		st.upSince.Store(u)
		st.downUntil.Store(u)
	}
	return true
}

// SetWeights sets the effective weights (the WLM weight cut by the QoS
// fraction, in whole weights) of the default level by target name, drops
// every per-action level, and swaps in a table balanced on them. Targets
// missing from w go back to their base weight; unknown names are ignored;
// negative weights count as 0. The QoS sampler uses SetFractions, which is
// exact for small weights; SetWeights is for weights computed elsewhere.
func (b *Balancer) SetWeights(w map[string]int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	cur := b.tab.Load()
	clear(b.eff)
	clear(b.levels)
	for _, t := range cur.vs.Targets {
		if x, ok := w[t.Name]; ok {
			b.eff[t.Name] = effWeight{units: min(max(x, 0), maxUnits/100) * 100, base: t.Weight}
		}
	}
	b.swap(cur.vs, cur.settings)
}

// maxUnits bounds a balancing weight (hundredths of a WLM weight).
const maxUnits = 1 << 30

// SetFractions sets the QoS fractions (percent) the weights are cut by, per
// service level, and swaps in one table per level, all at once: def holds
// the fractions, by target name, of new connections under no policy action;
// byAction holds, per action name, the fractions of new connections
// classified to that action (PickAction). Each target is balanced on
// policy.ExactWeight(its WLM weight, fraction), so a weight-1 target at
// 25 % gets exactly ¾ of an uncut weight-1 target's share. A target missing
// from a level's map is at its base weight in that level; an action missing
// from byAction is balanced like def. Unknown names are ignored.
func (b *Balancer) SetFractions(def map[string]int, byAction map[string]map[string]int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	cur := b.tab.Load()
	fill := func(dst map[string]effWeight, f map[string]int) {
		for _, t := range cur.vs.Targets {
			if x, ok := f[t.Name]; ok {
				dst[t.Name] = effWeight{units: policy.ExactWeight(t.Weight, x), base: t.Weight}
			}
		}
	}
	clear(b.eff)
	fill(b.eff, def)
	clear(b.levels)
	for name, f := range byAction {
		lv := map[string]effWeight{}
		fill(lv, f)
		b.levels[name] = lv
	}
	b.swap(cur.vs, cur.settings)
}

// swap builds and publishes a table with one sub-table per action level;
// b.mu must be held. The default and every level's table are published in
// one atomic store, so a pick sees one sample's weights at every level.
func (b *Balancer) swap(vs *policy.VirtualServer, s policy.BalancerSettings) {
	units := func(m map[string]effWeight) map[string]int {
		out := make(map[string]int, len(m))
		for name, e := range m {
			out[name] = e.units
		}
		return out
	}
	prev := b.tab.Load()
	t := newTable(vs, s, b.states, units(b.eff), prev)
	if len(b.levels) > 0 {
		t.levels = make(map[string]*table, len(b.levels))
		for name, lv := range b.levels {
			var p *table
			if prev != nil {
				p = prev.levels[name]
			}
			t.levels[name] = newTable(vs, s, b.states, units(lv), p)
		}
	}
	b.tab.Store(t)
}

// PickAction chooses a target for a new connection at now and reserves one of its
// connection slots; the caller must end the lease with Release (or Failed).
// flowHash is a hash of the connection's 5-tuple: Maglev maps it to a target,
// least-conn mixes it into its sampling, round robin ignores it.
//
// Only primaries that are up (no failed connect within the retry interval, no
// failed health check) and under their MaxConnections are chosen, by the
// configured algorithm over their effective weights. A primary the QoS cut to
// weight 0 is passed over while another primary can serve, and serves (before
// any backup) when none can; if every weighted primary is cut to 0 they are
// balanced as if equal. A target configured with weight 0, primary or
// backup, is draining: it takes no new connection at all (HAProxy's weight
// 0), even when nothing else can serve, and its open connections go on
// until they end; the refusal names it "draining (weight 0)". A primary in slow start is
// passed over with a probability that falls from 90 % to 0 over the window,
// but never when no other target could serve. When no primary can serve, the
// backups are tried in configured order and the first that can serve is
// chosen (their weights are ignored: backups are not balanced). When none
// can, PickAction returns a *NoTargetError naming every target and why.
//
// action is the policy action the connection is classified to (nil: none):
// it is balanced on that service level's weights (see SetFractions), or the
// default level's when the action has none.
//
// tried (nil for a connection that will not be retried) makes it a pick for
// a retry: it skips the targets in tried and adds the chosen one to it. Once
// tried holds MaxAttempts targets it returns a *NoTargetError instead. tried
// is the only bound on a connection's attempts: the caller loops until
// PickAction refuses. A connection's retry loop:
//
//	var tried balancer.Tried
//	for {
//		l, err := b.PickAction(now, hash, action, &tried)
//		if err != nil {
//			return err // refuse: 503 page or RST
//		}
//		c, err := dial(l.Target().Addr)
//		if err != nil {
//			l.Failed(now) // down for the retry interval; slot released
//			continue
//		}
//		// … serve, then l.Release()
//	}
//
// PickAction does not allocate when it returns a target, and never blocks.
func (b *Balancer) PickAction(now time.Time, flowHash uint64, action *policy.Action, tried *Tried) (Lease, error) {
	return b.pick(now, flowHash, action, tried)
}

func (b *Balancer) pick(now time.Time, flowHash uint64, action *policy.Action, tried *Tried) (Lease, error) {
	t := b.tab.Load()
	if action != nil && t.levels != nil {
		if lt := t.levels[action.Name]; lt != nil {
			t = lt
		}
	}
	ns := now.UnixNano()
	if tried != nil && tried.n >= t.attempts {
		b.refused.Add(1)
		return Lease{}, t.refuse(now, tried, true, nil)
	}
	// sk remembers the targets this pick found at their limit, so that
	// SkippedAtLimit counts each once per pick however often it is probed.
	var sk skipSet
	i, start := -1, 0
	switch t.settings.Algorithm {
	case policy.LeastConn:
		i, start = t.pickLeastConn(ns, flowHash, tried, &sk)
	case policy.Maglev:
		i, start = t.pickMaglev(ns, flowHash, tried, &sk)
	default:
		i, start = t.pickRoundRobin(ns, tried, &sk)
	}
	if i < 0 {
		i = t.pickAny(ns, start, tried, &sk)
	}
	if i < 0 {
		// The refusal pass tries every target once more while it records
		// reasons, so a slot freed meanwhile is taken rather than refused.
		err := t.refuse(now, tried, false, &sk)
		if err.picked < 0 {
			b.refused.Add(1)
			return Lease{}, err
		}
		i = err.picked
	}
	e := &t.entries[i]
	if tried != nil {
		tried.add(e.st)
	}
	return Lease{t: e.t, st: e.st, b: b, retry: t.retry, backup: i >= t.nPrimary}, nil
}

// usable reports whether primary i may be offered a connection by the fast
// paths: weighted (or, when every weighted primary is cut to 0, cut), up and
// not tried.
func (t *table) usable(i int, ns int64, tried *Tried) bool {
	e := &t.entries[i]
	return (e.weight > 0 || (t.allZero && e.base > 0)) && !e.st.down(ns) && !tried.has(e.st)
}

// admit applies slow-start thinning to primary i with the random value r:
// it is let through with probability rampPermille/1000.
func (t *table) admit(i int, ns int64, r uint64) bool {
	if t.slowStart == 0 {
		return true
	}
	f := t.entries[i].st.rampPermille(ns, t.slowStart)
	return f >= 1000 || int64(r%1000) < f
}

func (t *table) pickRoundRobin(ns int64, tried *Tried, sk *skipSet) (int, int) {
	n := uint64(len(t.sched))
	if n == 0 {
		return -1, 0
	}
	pos := t.cursor.Add(1) - 1
	r := pos
	for k := range probes {
		// The cursor's entry first; if it cannot serve, random entries, so a
		// full or down target's share spreads over the others in proportion
		// to their weights rather than going to its schedule neighbour.
		if k > 0 {
			r = mix(r)
		}
		i := int(t.sched[r%n])
		if t.usable(i, ns, tried) && t.admit(i, ns, mix(r^0xa5)) && t.entries[i].st.reserve(t.entries[i].max, sk) {
			return i, i
		}
	}
	return -1, int(t.sched[pos%n])
}

// lcLoad returns primary i's open connections and its weight (slow start
// applied) if it can take a connection now.
func (t *table) lcLoad(i int, ns int64, tried *Tried, sk *skipSet) (open, w float64, ok bool) {
	if !t.usable(i, ns, tried) {
		return 0, 0, false
	}
	e := &t.entries[i]
	o := e.st.open.Load()
	if lim := e.st.limit(e.max); e.max > 0 && o >= lim {
		sk.skip(e.st, lim < e.max)
		return 0, 0, false
	}
	return float64(o), float64(t.weightOf(i)) * float64(e.st.rampPermille(ns, t.slowStart)), true
}

// lcExact is the number of primaries up to which least-conn scans them all;
// above it, it compares two schedule entries (power of two choices), which
// keeps a pick O(1) for thousands of targets.
const lcExact = 32

func (t *table) pickLeastConn(ns int64, flowHash uint64, tried *Tried, sk *skipSet) (int, int) {
	n := uint64(len(t.sched))
	if n == 0 {
		return -1, 0
	}
	pos := t.cursor.Add(1) - 1
	first := int(t.sched[pos%n]) // the round-robin pick wins ties
	for range 3 {
		// best minimises open/weight, compared cross-multiplied.
		best, bestOpen, bestW := -1, 0.0, 0.0
		try := func(i int) {
			if open, w, ok := t.lcLoad(i, ns, tried, sk); ok && (best < 0 || open*bestW < bestOpen*w) {
				best, bestOpen, bestW = i, open, w
			}
		}
		if t.nPrimary <= lcExact {
			for i := first; i < t.nPrimary; i++ {
				try(i)
			}
			for i := 0; i < first; i++ {
				try(i)
			}
		} else {
			try(first)
			try(int(t.sched[mix(pos^flowHash)%n]))
		}
		if best < 0 {
			break
		}
		if t.entries[best].st.reserve(t.entries[best].max, sk) {
			return best, best
		}
	}
	return -1, first
}

func (t *table) pickMaglev(ns int64, flowHash uint64, tried *Tried, sk *skipSet) (int, int) {
	m := uint64(len(t.maglev))
	if m == 0 {
		return -1, 0
	}
	p := flowHash % m
	r := flowHash
	for k := range probes {
		// The flow's own slot first; then slots chosen by re-hashing the
		// flow, so a target that cannot serve hands its flows to the others
		// in proportion to their slots, the same on every instance.
		if k > 0 {
			r = mix(r)
			p = r % m
		}
		i := int(t.maglev[p])
		if t.usable(i, ns, tried) && t.admit(i, ns, mix(r^0xa5)) && t.entries[i].st.reserve(t.entries[i].max, sk) {
			return i, i
		}
	}
	return -1, int(t.maglev[flowHash%m])
}

// pickAny is the pass after the fast path, without slow-start thinning: every
// usable primary once from start; then the primaries the QoS fraction cut to
// weight 0 (a cut steers connections to the others, it does not refuse them
// when no other primary can serve); then the backups in configured order.
// Targets configured with weight 0 (draining) are never offered a
// connection.
func (t *table) pickAny(ns int64, start int, tried *Tried, sk *skipSet) int {
	for k := range t.nPrimary {
		i := (start + k) % t.nPrimary
		if t.usable(i, ns, tried) && t.entries[i].st.reserve(t.entries[i].max, sk) {
			return i
		}
	}
	free := func(i int) bool {
		e := &t.entries[i]
		return e.base > 0 && !e.st.down(ns) && !tried.has(e.st) && e.st.reserve(e.max, sk)
	}
	for k := range t.nPrimary {
		i := (start + k) % t.nPrimary
		if e := &t.entries[i]; e.base > 0 && e.weight == 0 && free(i) {
			return i
		}
	}
	for i := t.nPrimary; i < len(t.entries); i++ {
		if free(i) {
			return i
		}
	}
	return -1
}

// skipSet is the set of targets one pick found at their limit or share; it
// lives on the pick's stack. Beyond its capacity a target may be counted
// more than once.
type skipSet struct {
	st [MaxTried]*targetState
	n  int
}

// skip counts st as skipped at its limit (or, share set, at its share of a
// cluster-wide limit), once per pick.
func (sk *skipSet) skip(st *targetState, share bool) {
	count := func() {
		if share {
			st.skippedAtShare.Add(1)
		} else {
			st.skippedAtLimit.Add(1)
		}
	}
	if sk == nil {
		count()
		return
	}
	for _, s := range sk.st[:sk.n] {
		if s == st {
			return
		}
	}
	if sk.n < len(sk.st) {
		sk.st[sk.n] = st
		sk.n++
	}
	count()
}

// MaxTried is the most targets one connection can try: the size of Tried,
// and the upper bound policy.Compile puts on MaxAttempts.
const MaxTried = policy.MaxAttemptsLimit

// Tried is the set of targets one connection has already been given, for
// PickAction's retries. The zero value is empty; it is a fixed-size value meant to live
// on the caller's stack. It identifies targets by their live state, so it
// stays right across table swaps.
type Tried struct {
	st [MaxTried]*targetState
	n  int
}

// Len returns the number of targets tried.
func (tr *Tried) Len() int { return tr.n }

func (tr *Tried) has(st *targetState) bool {
	if tr == nil {
		return false
	}
	for _, s := range tr.st[:tr.n] {
		if s == st {
			return true
		}
	}
	return false
}

func (tr *Tried) add(st *targetState) {
	if tr.n < MaxTried && !tr.has(st) {
		tr.st[tr.n] = st
		tr.n++
	}
}

// Lease is one reserved connection slot on a target, returned by PickAction. It is
// a small value; pass it by pointer or keep the one copy whose Release is
// called. The zero Lease holds nothing.
type Lease struct {
	t      *policy.Target
	st     *targetState
	b      *Balancer // for outlier ejection (Failed)
	retry  int64     // retry interval of the table it came from, ns
	backup bool
}

// Target returns the chosen target (nil for the zero Lease).
func (l *Lease) Target() *policy.Target { return l.t }

// Name returns the chosen target's name ("" for the zero Lease), also after
// Release.
func (l *Lease) Name() string {
	if l.t == nil {
		return ""
	}
	return l.t.Name
}

// Backup reports whether the target is a backup, chosen because no primary
// could serve.
func (l *Lease) Backup() bool { return l.backup }

// Held reports whether the lease still holds its slot.
func (l *Lease) Held() bool { return l.st != nil }

// Release gives the connection slot back (the connection closed). It is
// idempotent on one Lease value and works after any table swap, including one
// that removed the target.
func (l *Lease) Release() {
	if l.st == nil {
		return
	}
	l.st.open.Add(-1)
	l.st = nil
}

// Failed reports that connecting to the target failed at now (or that it
// sent nothing within the first-byte timeout): the target is down until now
// plus the retry interval (slow start, if configured, ramps it from then),
// the failure counts toward outlier ejection (Report), and the slot is
// released. A no-op once released.
func (l *Lease) Failed(now time.Time) {
	st := l.st
	if st == nil {
		return
	}
	until := now.UnixNano() + l.retry
	st.failed.Add(1)
	st.upSince.Store(until)
	st.downUntil.Store(until)
	l.Release()
	if l.b != nil {
		l.b.observe(st, false, now)
	}
}
