package balancer

import (
	"math"
	"sync"
	"sync/atomic"
)

// noCapacity is a targetState's capacity when no share is set.
const noCapacity = math.MaxInt64

// targetState is the live state of one target. It is keyed by target name and
// shared by every table that contains a target of that name, so connection
// counts, down-state, health and counters survive a table swap (QoS weights,
// reload, health). A Lease points at it directly, so a release after a swap, or
// after the target left the configuration, still lands on the right count.
type targetState struct {
	name string

	// open counts connections reserved by Pick and not yet released. Pick
	// raises it with a compare-and-swap bounded by MaxConnections, so it never
	// exceeds the limit of the table that reserved the slot.
	open atomic.Int64
	// downUntil is a Unix time in nanoseconds: the target is down while
	// now < downUntil (a failed connect). 0: never failed.
	downUntil atomic.Int64
	// healthDown is set while active health checks say the target is down.
	healthDown atomic.Bool
	// upSince is the Unix time in nanoseconds at which the target last came
	// back (end of a retry interval, or a health check turning it up); slow
	// start ramps its weight from there. 0: it never went down.
	upSince atomic.Int64

	// capacity is this instance's share of a MaxConnections that several
	// instances share (SetCapacity), noCapacity when there is none. reserve
	// raises open and then reads capacity again; SetCapacity stores it and
	// then reads open: with sequentially consistent atomics one sees the
	// other, so the count SetCapacity returns bounds every slot reserved
	// under the old share.
	capacity atomic.Int64

	skippedAtLimit atomic.Uint64 // picks that found it at MaxConnections, once per pick
	skippedAtShare atomic.Uint64 // picks that found it at its share, below MaxConnections
	picked         atomic.Uint64 // connections reserved on it
	failed         atomic.Uint64 // connects reported failed through Lease.Failed

	// consecutive counts the failures reported in a row (Lease.Failed,
	// Report) for outlier ejection; a success resets it. ejectedUntil is a
	// Unix time in nanoseconds: the target is ejected while now <
	// ejectedUntil. ejections counts the ejections.
	consecutive  atomic.Int64
	ejectedUntil atomic.Int64
	ejections    atomic.Uint64

	mu     sync.Mutex // guards health and check
	health Health
	check  CheckStatus // the last check's result; zero At: none yet
}

// reserve takes one connection slot if the target is under max (≤ 0: no
// limit) and under its share (capacity) of a cluster-wide max. A target
// found at its limit or share is recorded in sk, which raises its
// SkippedAtLimit or SkippedAtShare counter once per pick.
func (s *targetState) reserve(max int64, sk *skipSet) bool {
	if max <= 0 {
		s.open.Add(1)
		s.picked.Add(1)
		return true
	}
	for {
		n := s.open.Load()
		if n >= max {
			sk.skip(s, false)
			return false
		}
		c := s.capacity.Load()
		if n >= c {
			sk.skip(s, true)
			return false
		}
		if s.open.CompareAndSwap(n, n+1) {
			// A SetCapacity that shrank the share meanwhile either sees
			// this slot or is seen here.
			if now := s.capacity.Load(); now != c && n+1 > now {
				s.open.Add(-1)
				sk.skip(s, true)
				return false
			}
			s.picked.Add(1)
			return true
		}
	}
}

// limit is the connections the target may hold here: max (≤ 0: no
// limit), or its share of it when one is set.
func (s *targetState) limit(max int64) int64 {
	if max <= 0 {
		return max
	}
	return min(max, s.capacity.Load())
}

// down reports whether the target may not take connections at ns (Unix
// nanoseconds): a failed connect within the retry interval, a failed
// health check, or an outlier ejection.
func (s *targetState) down(ns int64) bool {
	return s.healthDown.Load() || ns < s.downUntil.Load() || ns < s.ejectedUntil.Load()
}

// rampPermille is the slow-start factor at ns in thousandths: 100 (a tenth of
// the weight) right after the target came back, rising linearly to 1000 at
// upSince+window. window ≤ 0 turns slow start off.
func (s *targetState) rampPermille(ns, window int64) int64 {
	if window <= 0 {
		return 1000
	}
	since := s.upSince.Load()
	if since == 0 || ns >= since+window {
		return 1000
	}
	el := ns - since
	if el < 0 {
		el = 0
	}
	return 100 + 900*el/window
}
