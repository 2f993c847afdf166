package proxy

import "time"

// Streaming: what "data waiting" means.
//
// weir cannot see a target's send queue, nor (on a host-socket leg) its
// own peer's, so it judges a backlog by how data arrives. Every read, in
// either direction, ends a gap: the time since the connection's previous
// read. Each splice half adds its gaps and bytes up into a span, and
// credits the span's gaps as streaming time (the connection's streaming counter) as soon
// as the span's bytes reach StreamRate over its gaps; a span still short of
// that after StreamWindow of wall time is dropped, and so is a single gap
// longer than StreamWindow. So data counts as streaming when it keeps
// coming at StreamRate or faster on average over any stretch up to
// StreamWindow, however gappy: a sender with a backlog on a throttled path
// moves a lot over a second even when 8 connections sharing a capped link
// get their segments in turns hundreds of milliseconds apart (the first
// read after a pause carries one segment, those right after it the rest of
// the turn), or a loss stalls it for a retransmission timeout; a keystroke
// and its echo, a keep-alive or a screen redrawn once a second bring a few
// bytes or a few KB per second. A fixed limit on one gap (250 ms before)
// judged the first case idle and a fast typist (a byte every 200 ms)
// streaming.
//
// The sampler then counts a connection as waiting for an interval when its
// streaming time is at least half of its time in the interval
// (AggSample.Waiting), and reports that streaming time (WaitingTime): the
// MinRate check without a MeanRate judges those connections by their rate
// while their data was moving.
//
// Limits of the rule: a bulk transfer throttled below StreamRate is not
// told from an interactive session and is never judged slow; a client too
// slow to take the data stalls the target→client half in Write and counts
// like a slow target; a span is credited to the interval in which it
// reached StreamRate, so a stall across a sampling boundary moves streaming
// time into the next interval.

// StreamRate is the slowest delivery, in bytes per second (32 Kbit/s),
// that still counts as a stream of data (see "Streaming" above). Far
// below any MinRate worth setting (the seed's is 500 Kbit/s) and far above
// a typist's or a once-a-second status screen's few hundred bytes per
// second.
const StreamRate = 4000

// StreamWindow is the longest stretch of wall time over which a splice
// half averages its reads before it gives up on them (see "Streaming"):
// longer than a turn on a shared link and than a retransmission timeout on
// a path whose bottleneck queue holds 2 s (the 8-connection TBF e2e stalls
// for more than 2 s after its queue overflows), short enough that a few
// keystrokes followed by a command's output are rarely one stream.
const StreamWindow = 5 * time.Second

// StreamMeter is one splice half's pending span of reads (see
// "Streaming"). The zero value is ready; it is owned by the half's
// goroutine.
type StreamMeter struct {
	since   int64 // unix nanoseconds the pending span began
	pending int64 // its gaps, nanoseconds
	bytes   int64 // its bytes
}

// Read takes a read of n bytes at now (unix nanoseconds), gap nanoseconds
// after the connection's previous read, and returns the nanoseconds to
// credit as streaming time, 0 while the span is short of StreamRate. It
// runs once per read in the splice: no allocation, no lock.
func (m *StreamMeter) Read(now, gap int64, n int) int64 {
	if gap < 0 || gap > int64(StreamWindow) {
		m.since, m.pending, m.bytes = now, 0, 0
		return 0
	}
	if now-m.since > int64(StreamWindow) {
		m.since, m.pending, m.bytes = now-gap, 0, 0
	}
	m.pending += gap
	m.bytes += int64(n)
	if m.bytes*int64(time.Second) < m.pending*StreamRate {
		return 0
	}
	credit := m.pending
	m.since, m.pending, m.bytes = now, 0, 0
	return credit
}
