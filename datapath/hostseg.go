package datapath

import "time"

// Feeding a SegStats from outside the Engine
//
// A leg the Engine does not carry (a via: host target leg: a kernel socket)
// is measured by a packet capture (datapath/hostcap) that sees its segments
// where they leave and enter the host. Observe gives such a capture the
// sequence tracker the Engine uses for its back-leg flows, with the same
// rules (seqtrack.go): one writer per direction, counters read by anyone.

// Observe records one TCP segment of the flow, parsed into pk from b (only
// its headers are read, but b must be pk.Len bytes long, as Parse wants:
// a capture of the headers alone puts them in a buffer of that size), or a
// super-packet standing for segs of them (GSO/GRO, see Segments).
// fromTarget says the segment is the target's (FromTarget), else it is
// toward the target (ToTarget). now is the segment's time on any clock
// that is the same for every call on s; minRTO is the timeout heuristic's
// floor for that direction's sender (DefaultTargetMinRTO, DefaultOwnMinRTO
// or the engine's options). Calls for one direction must come from one
// goroutine at a time.
func (s *SegStats) Observe(b []byte, pk *Packet, segs int, fromTarget bool, now, minRTO time.Duration) {
	if fromTarget {
		s.ingress(b, pk, segs, int64(now), int64(minRTO))
	} else {
		s.egress(b, pk, segs, int64(now), int64(minRTO))
	}
}
