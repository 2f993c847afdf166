package policy

//go:generate go run golang.org/x/tools/cmd/stringer@v0.52.0 -type=Direction,Scope -linecomment -output=direction_string.go
import "fmt"

// Which segments the monitor measures
//
// The z/OS monitor watches "outbound traffic being serviced by the target
// servers": the segments the target sends. A target leg has two directions,
// each counted in data segments (segments with payload; pure ACKs never
// count, so a download's ACK stream cannot dilute a ratio):
//
//	from_target: the target's segments toward weir, the seed's direction
//	             and the default (Monitor.Direction FromTarget)
//	to_target:   weir's own segments toward the target
//
// Loss ratio = retransmitted data segments / data segments of the chosen
// direction, timeout ratio = timeouts / data segments likewise. With
// DirectionBoth the direction with the larger loss ratio (on a tie, the
// larger timeout ratio) is read, both ratios from it, so that one
// denominator stays behind both. A direction that was not measured for the
// interval (Measured false: a host socket's from_target without the host
// capture has no retransmission count; a capture that lost packets in the
// interval counted it only in part) gives way to the other.
//
// Monitor.Scope says whose connections count: ScopePolicy (the default, the
// seed's "the traffic to be monitored must be represented by at least one
// Differentiated Services policy") only connections a policy rule matched;
// ScopeAll every connection.

// Direction selects the segments the loss and timeout ratios read.
type Direction uint8

// The directions.
const (
	// the target's segments (default)
	FromTarget Direction = iota // fromTarget
	// weir's segments toward the target
	ToTarget // toTarget
	// the larger of the two
	DirectionBoth // both
)

// ParseDirection parses fromTarget, toTarget or both.
func ParseDirection(s string) (Direction, error) {
	for d := FromTarget; d <= DirectionBoth; d++ {
		if d.String() == s {
			return d, nil
		}
	}
	return 0, fmt.Errorf("unknown direction %q (want fromTarget, toTarget or both)", s)
}

// Scope selects the connections that feed a target's ratios.
type Scope uint8

// The scopes.
const (
	// connections a policy rule matched (default)
	ScopePolicy Scope = iota // policy
	// every connection
	ScopeAll // all
)

// ParseScope parses policy or all.
func ParseScope(s string) (Scope, error) {
	switch s {
	case "policy":
		return ScopePolicy, nil
	case "all":
		return ScopeAll, nil
	}
	return 0, fmt.Errorf("unknown scope %q (want policy or all)", s)
}

// DirSample is one direction of a target's legs over a sampling interval.
type DirSample struct {
	DataSegments  uint64 // segments with payload, retransmissions included
	Retransmitted uint64 // of those, retransmitted
	Timeouts      uint64 // retransmission timeouts
	OutOfOrder    uint64 // data segments that arrived out of order
	// IPIDPackets counts the packets the IP-ID loss signal judged in the
	// interval (datapath/ipid.go: the counts include the losses it found);
	// 0 means the sequence rule alone.
	IPIDPackets uint64
	// Measured is false when no connection of the interval had this
	// direction's retransmissions counted; Estimate is true when some
	// connection's counts are only an estimate (a host socket's receive
	// side); Partial is true when they were counted by a capture that lost
	// packets in the interval (its counts may miss retransmissions, so the
	// direction is not Measured). All are for status; SelectDirection
	// skips an unmeasured direction.
	Measured, Estimate, Partial bool
}

// SelectDirection fills s.SegmentsSent, s.Retransmits and s.Timeouts from
// the direction m reads (see the file comment) and returns it (FromTarget or
// ToTarget).
func SelectDirection(m *Monitor, s *TargetSample) Direction {
	d := m.Direction
	switch {
	case d == DirectionBoth:
		d = FromTarget
		if larger(&s.ToTarget, &s.FromTarget) {
			d = ToTarget
		}
	case d == FromTarget && !s.FromTarget.Measured && s.ToTarget.Measured:
		d = ToTarget
	case d == ToTarget && !s.ToTarget.Measured && s.FromTarget.Measured:
		d = FromTarget
	}
	ds := &s.FromTarget
	if d == ToTarget {
		ds = &s.ToTarget
	}
	s.SegmentsSent, s.Retransmits, s.Timeouts = ds.DataSegments, ds.Retransmitted, ds.Timeouts
	return d
}

// larger reports whether a's loss ratio (then timeout ratio) exceeds b's;
// an unmeasured direction is never larger.
func larger(a, b *DirSample) bool {
	if !a.Measured {
		return false
	}
	if !b.Measured {
		return true
	}
	// a.R/a.D > b.R/b.D without division: a.R·b.D > b.R·a.D.
	if mulGT(a.Retransmitted, b.DataSegments, b.Retransmitted, a.DataSegments) {
		return true
	}
	if mulGT(b.Retransmitted, a.DataSegments, a.Retransmitted, b.DataSegments) {
		return false
	}
	return mulGT(a.Timeouts, b.DataSegments, b.Timeouts, a.DataSegments)
}
