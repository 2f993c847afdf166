package balancer

import (
	"slices"
	"strings"
	"sync/atomic"

	"weir/policy"
)

// maxSchedule bounds the round-robin schedule (entries of 4 bytes, so 4 MiB).
// When the effective weights, divided by their greatest common divisor, sum to
// more, they are scaled down to fit; each weight's share is then off by at
// most half an entry of its scaled weight.
const maxSchedule = 1 << 20

// probes is how many schedule or Maglev entries a pick looks at before it
// falls back to a pass over every target. Skipping a full or down target
// costs one probe.
const probes = 8

// entry is one target in a table: its configuration at the time the table was
// built and its live state, shared by name with every other table.
type entry struct {
	t      *policy.Target
	st     *targetState
	base   int   // WLM weight from the configuration; 0: draining
	weight int   // balancing weight in hundredths of a WLM weight (policy.ExactWeight)
	max    int64 // MaxConnections; ≤ 0: no limit
}

// table is an immutable snapshot of one virtual server's targets, weights and
// settings, built on every reload, weight change or membership change, and
// swapped whole. Only cursor changes after it is published.
type table struct {
	vs       *policy.VirtualServer
	settings policy.BalancerSettings // as compiled by policy.Compile

	// entries holds the primaries in configured order, then the backups in
	// configured order.
	entries  []entry
	nPrimary int
	// allZero is set when the QoS fraction cut every primary with a
	// positive WLM weight to 0 (every target reported fully degraded): those
	// are then balanced as if each had weight 1, rather than refusing every
	// connection while targets that can take it stand idle. A weight of 0
	// steers traffic to the others; it is not a reason to refuse when there
	// are no others. Targets configured with weight 0 (draining) are not
	// among them: they take no new connection (see pickAny).
	allZero bool

	// levels holds one table per policy action name with weights of its
	// own (SetFractions); nil in the level tables themselves. Pick for a
	// connection under an action missing here uses this table.
	levels map[string]*table

	retry     int64 // retry interval, ns
	slowStart int64 // slow-start window, ns; 0: off
	attempts  int   // MaxAttempts, held to 1..MaxTried

	// sched interleaves primary indices in proportion to their effective
	// weights (see schedule); round robin walks it with cursor, least-conn
	// samples it. nil for Maglev.
	sched []uint32
	// maglev is the Maglev lookup table over primary indices; nil unless the
	// algorithm is Maglev.
	maglev []uint32

	_      [64]byte // keep cursor off the cache lines read by every pick
	cursor atomic.Uint64
	_      [56]byte
}

// newTable builds a table for vs with settings s, both compiled by
// policy.Compile (defaults filled, values checked). states maps names to live state (it is
// consulted, never changed); eff maps names to effective weights (absent: the
// base weight). prev, the table being replaced (may be nil), lends its
// schedule or Maglev table when the primaries and their weights are the same,
// so a QoS sample that changes nothing costs no rebuild.
func newTable(vs *policy.VirtualServer, s policy.BalancerSettings, states map[string]*targetState, eff map[string]int, prev *table) *table {
	t := &table{
		vs:        vs,
		settings:  s,
		retry:     int64(s.RetryInterval),
		slowStart: int64(s.SlowStart),
		// Compile rejects a MaxAttempts outside 1..MaxTried; held to it
		// here (a bound, not a default) so that whoever built s, the
		// tried-set bounds a connection's attempts.
		attempts: min(max(s.MaxAttempts, 1), MaxTried),
	}
	for _, role := range []policy.Role{policy.RolePrimary, policy.RoleBackup} {
		for _, pt := range vs.Targets {
			if pt.Role != role {
				continue
			}
			w, ok := eff[pt.Name]
			if !ok {
				w = policy.ExactWeight(pt.Weight, 0)
			}
			if pt.Weight <= 0 {
				w = 0 // configured weight 0: draining, whatever a sample says
			}
			t.entries = append(t.entries, entry{
				t:      pt,
				st:     states[pt.Name],
				base:   pt.Weight,
				weight: max(w, 0),
				max:    pt.MaxConnections,
			})
		}
		if role == policy.RolePrimary {
			t.nPrimary = len(t.entries)
		}
	}
	ws := make([]int, t.nPrimary)
	sum := 0
	for i := range ws {
		ws[i] = t.entries[i].weight
		sum += ws[i]
	}
	if sum == 0 {
		for i := range ws {
			if t.entries[i].base > 0 {
				t.allZero = true
				ws[i] = 1
			}
		}
	}
	if prev != nil {
		// Go on where the last table's round robin stopped: restarting at 0
		// on every QoS sample would favour the schedule's first entries
		// whenever samples come more often than full cycles.
		t.cursor.Store(prev.cursor.Load())
	}
	if prev != nil && prev.settings.Algorithm == s.Algorithm && prev.samePrimaries(t) {
		t.sched, t.maglev = prev.sched, prev.maglev
	} else if t.nPrimary > 0 {
		if s.Algorithm == policy.Maglev {
			// Build over the primaries sorted by name, so that instances
			// listing the same targets in another order agree on the table.
			order := make([]int, t.nPrimary)
			for i := range order {
				order[i] = i
			}
			slices.SortFunc(order, func(a, b int) int {
				return strings.Compare(t.entries[a].t.Name, t.entries[b].t.Name)
			})
			names := make([]string, t.nPrimary)
			sws := make([]int, t.nPrimary)
			for k, i := range order {
				names[k], sws[k] = t.entries[i].t.Name, ws[i]
			}
			t.maglev = buildMaglev(names, sws, maglevSize(t.nPrimary))
			for k, x := range t.maglev {
				t.maglev[k] = uint32(order[x])
			}
		} else {
			t.sched = schedule(ws)
		}
	}
	return t
}

// samePrimaries reports whether o lists the same primaries, in the same order,
// with the same weights as t: then their schedules and Maglev tables are equal.
func (t *table) samePrimaries(o *table) bool {
	if t.nPrimary != o.nPrimary || t.allZero != o.allZero {
		return false
	}
	for i := range t.nPrimary {
		a, b := &t.entries[i], &o.entries[i]
		if a.t.Name != b.t.Name || a.weight != b.weight {
			return false
		}
	}
	return true
}

// weightOf is the weight entry i is balanced with: its balancing weight, or
// 1 for every primary with a positive WLM weight when all of them are cut
// to 0.
func (t *table) weightOf(i int) int {
	if t.allZero {
		if t.entries[i].base > 0 {
			return 1
		}
		return 0
	}
	return t.entries[i].weight
}

// displayWeight turns a balancing weight (hundredths) into the whole
// effective weight shown to people: rounded down, but at least 1 while it is
// positive (policy.EffectiveWeight).
func displayWeight(units int) int {
	if units > 0 && units < 100 {
		return 1
	}
	return units / 100
}

// nginxBudget bounds the work (entries × weighted targets) spent building a
// schedule with nginx's algorithm; beyond it the O(log n) builder is used.
const nginxBudget = 1 << 24

// schedule returns primary indices interleaved in proportion to ws: over the
// whole schedule index i appears exactly ws[i] times (after reduction by the
// greatest common divisor and, beyond maxSchedule, scaling), and every prefix
// is close to proportional, so a cursor walking it is a smooth weighted round
// robin, and picking is one atomic add and one load whatever the target count.
//
// The schedule is nginx's smooth weighted round robin, run once over a whole
// cycle (for weights 5, 1, 1: a a b a c a a), which keeps every target within
// one pick of its share at every prefix. That costs O(n) per entry, so when
// entries × targets exceeds nginxBudget (thousands of targets with large
// weights) the schedule is built by earliest-deadline-first instead: O(log n)
// per entry, within about 2 picks of proportional (see scheduleEDF).
func schedule(ws []int) []uint32 {
	w := reduceWeights(ws)
	total, live := 0, 0
	for _, x := range w {
		total += x
		if x > 0 {
			live++
		}
	}
	if total == 0 {
		return nil
	}
	if total*live <= nginxBudget {
		return scheduleNginx(w, total)
	}
	return scheduleEDF(w, total)
}

// scheduleNginx runs nginx's algorithm (ngx_http_upstream_get_peer) for one
// cycle of total picks: every pick, each target's current weight grows by its
// weight, the largest (first on ties) is chosen and loses total.
func scheduleNginx(w []int, total int) []uint32 {
	var idx []int
	for i, x := range w {
		if x > 0 {
			idx = append(idx, i)
		}
	}
	cur := make([]int, len(w))
	out := make([]uint32, 0, total)
	for range total {
		best := -1
		for _, i := range idx {
			cur[i] += w[i]
			if best < 0 || cur[i] > cur[best] {
				best = i
			}
		}
		cur[best] -= total
		out = append(out, uint32(best))
	}
	return out
}

// scheduleEDF builds the schedule by earliest-deadline-first, the
// stride-scheduling form of smooth weighted round robin, using a heap: the
// c-th pick of target i (from 0) has the virtual deadline (c+φᵢ)/wᵢ, and the
// schedule lists deadlines in order. The phases φᵢ in (0, 1) are spread by
// the golden ratio so that light targets do not all fall due at the same
// moment of the cycle (with φ = ½ for all, a weight-1000 target among forty
// weight-1 ones drifts 19 picks from its share; staggered, under 2). Each
// target gets exactly its weight per cycle, since (c+φ)/w < 1 exactly for
// c < w.
func scheduleEDF(w []int, total int) []uint32 {
	// Phases as fractions of q; deadlines compared cross-multiplied, which
	// stays below 2^57 for counts and weights up to maxSchedule.
	const q = 1 << 16
	phase := make([]int, len(w))
	for i := range phase {
		f := float64(i+1) * 0.6180339887498949
		phase[i] = 1 + int((f-float64(int(f)))*(q-2))
	}
	count := make([]int, len(w))
	less := func(a, b int) bool {
		l, r := (count[a]*q+phase[a])*w[b], (count[b]*q+phase[b])*w[a]
		if l != r {
			return l < r
		}
		return a < b
	}
	h := make([]int, 0, len(w))
	for i, x := range w {
		if x > 0 {
			h = append(h, i)
		}
	}
	down := func(i int) {
		for {
			l := 2*i + 1
			if l >= len(h) {
				return
			}
			m := l
			if r := l + 1; r < len(h) && less(h[r], h[l]) {
				m = r
			}
			if !less(h[m], h[i]) {
				return
			}
			h[i], h[m] = h[m], h[i]
			i = m
		}
	}
	for i := len(h)/2 - 1; i >= 0; i-- {
		down(i)
	}
	out := make([]uint32, 0, total)
	for len(h) > 0 {
		i := h[0]
		out = append(out, uint32(i))
		count[i]++
		if count[i] == w[i] {
			h[0] = h[len(h)-1]
			h = h[:len(h)-1]
		}
		down(0)
	}
	return out
}

// reduceWeights divides ws by their greatest common divisor and, if they still
// sum beyond maxSchedule, scales them to fit (a positive weight stays ≥ 1).
func reduceWeights(ws []int) []int {
	g := 0
	for _, x := range ws {
		if x > 0 {
			g = gcd(g, x)
		}
	}
	out := make([]int, len(ws))
	if g == 0 {
		return out
	}
	total := 0
	for i, x := range ws {
		if x > 0 {
			out[i] = x / g
			total += out[i]
		}
	}
	if total <= maxSchedule {
		return out
	}
	scale := float64(maxSchedule-len(ws)) / float64(total)
	for i, x := range out {
		if x > 0 {
			out[i] = max(1, int(float64(x)*scale+0.5))
		}
	}
	return out
}

func gcd(a, b int) int {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// mix is the splitmix64 finaliser: it spreads a counter or a flow hash over
// 64 bits for sampling.
func mix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}
