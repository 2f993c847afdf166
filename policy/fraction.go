package policy

//go:generate go run golang.org/x/tools/cmd/stringer@v0.52.0 -type=Winner -linecomment -output=winner_string.go
import (
	"fmt"
	"math"
	"math/bits"
	"strconv"
	"time"
)

// Weight fractions: the z/OS Sysplex Distributor policy performance monitor.
//
// Flow, once per SamplingInterval and per target (Sampler.Sample, or Explain
// for one target):
//
//	TargetSample ──► loss ratio     ──► LossFraction    ─┐
//	(segments,   ──► timeout ratio  ──► TimeoutFraction ─┼─► default QoS fraction ─┐
//	 conns,          (noise guard: < MinSegments holds)  │   (100 when constrained) │
//	 bytes)      ──► connections vs the target's limit ──┘                          ├─► max ─► EffectiveWeight
//	ActionSample ──► connections vs the action's limit ──► ConnFraction ────────────┤
//	             ──► throughput vs MeanRate and MinRate ─► MinRateFraction ─────────┘
//
// Every step is a pure function of its inputs; the Sampler adds only the
// per-target memory the noise guard needs. Ratios are in tenths of a percent
// and fractions in percent, as in the seed's PolicyPerfMonitorForSDR.

// MinSegments is the default noise guard, DefaultMinSegments; the running
// value is Monitor.MinSegments. A target's loss and timeout ratios are judged
// only over at least that many segments (one retransmission in 20 segments
// is 5 %): a target that sent fewer in an interval is held, and its counts
// are carried into the next interval and added up until they reach the
// guard, when the ratios are judged over the whole accumulated span. While
// held, the loss and timeout fractions keep their last judged values, so a
// low-volume Telnet target's loss is seen after a few intervals rather than
// hidden for ever. One exception keeps a cut from sticking: an interval in
// which the target sent no segment at all (a target cut to 100 % gets no new
// connection) lowers each fraction by one step (LossStep, TimeoutStep), so
// it regains its weight after ⌈max/step⌉ silent intervals. The connection
// and MinRate checks are not guarded: connection counts are exact.
const MinSegments = DefaultMinSegments

// ConstrainedPercent is the constrained threshold: a target whose open
// connections reach this share of its MaxConnections gets a default QoS
// fraction of 100 %, so new connections go elsewhere while another target can
// take them.
const ConstrainedPercent = 90

// MinRateBusyPercent is the share of an action's MeanRate above which the
// per-connection throughput is compared with MinRate.
const MinRateBusyPercent = 85

// TargetSample is what the netstack measured for one target over one sampling
// interval. The counters are deltas over the interval, not running totals.
type TargetSample struct {
	// Interval is the length of the interval the sample covers; zero means
	// the Monitor's SamplingInterval.
	Interval time.Duration
	// FromTarget and ToTarget are the target legs' data segments per
	// direction, from the connections the Monitor's Scope monitors.
	// SelectDirection copies the direction the Monitor reads into
	// SegmentsSent, Retransmits and Timeouts, which Explain reads.
	FromTarget, ToTarget DirSample
	// SegmentsSent counts the TCP segments the target's connections sent,
	// retransmissions included (gVisor's SegmentsSent).
	SegmentsSent uint64
	// Retransmits counts the retransmitted segments among SegmentsSent
	// (gVisor's Retransmits): the loss ratio is Retransmits / SegmentsSent.
	Retransmits uint64
	// Timeouts counts retransmission timeouts (RTO expiries, gVisor's
	// Timeouts): the timeout ratio is Timeouts / SegmentsSent.
	Timeouts uint64
	// TimeoutsUnknown is set when some of the target's connections cannot
	// count their retransmission timeouts (a host socket on a kernel older
	// than 6.7 has no tcpi_total_rto): Timeouts is then a lower bound, and
	// the timeout fraction keeps its last judged value instead of reading
	// the missing counts as 0 %.
	TimeoutsUnknown bool
	// ActiveConns is the number of connections open to the target at the end
	// of the interval.
	ActiveConns int64
	// Bytes is the payload the target's connections carried in the interval,
	// both directions.
	Bytes uint64
	// Actions holds one entry per policy action with connections to this
	// target; a flow with no matching rule is in none.
	Actions []ActionSample
	// Responses counts the http requests the target answered in the
	// interval (any status), and ServerErrors those of them answered with a
	// 5xx status: the error ratio is ServerErrors / Responses.
	// FailedRequests counts the requests sent to the target that failed
	// before a response (first-byte timeout, connection cut: weir's 502 or
	// 503); they count as errors, and in the denominator, only with
	// Monitor.ErrorCountsFailures. All zero for a tcp service.
	Responses, ServerErrors, FailedRequests uint64
}

// ActionSample is the part of a TargetSample under one policy action: the
// flows to the target that the rules classified into Action.
type ActionSample struct {
	// Action is the action the flows were classified into. The Sampler
	// resolves it again by name in the current Config, so a sample that
	// straddles a reload is judged by the new action's settings.
	Action *Action
	// ActiveConns is the number of those flows open at the end of the
	// interval.
	ActiveConns int64
	// Bytes is their payload over the interval, both directions.
	Bytes uint64
	// WaitingConns is the number of those flows that had data waiting to
	// be sent during the interval (a sender with a backlog), and
	// WaitingBytes their payload over the interval. They are what MinRate
	// judges when the action has no MeanRate (see MinRateFraction): an idle
	// session has nothing waiting and is not slow.
	WaitingConns int64
	WaitingBytes uint64
	// WaitingTime is the sum of those flows' streaming time in the
	// interval: the time data kept moving through them (netstack's
	// StreamRate rule), so one that opened, closed or stalled in the
	// interval counts only its part. Zero means unknown: each counts the
	// whole interval. WaitingBytes/WaitingTime is their rate per flow
	// while they had data waiting.
	WaitingTime time.Duration
	// OpenTime is the sum of each of the action's flows' time open in the
	// interval: the whole interval for one open throughout, up to its end
	// for one that closed, from its start for one that opened. Bytes /
	// OpenTime is the rate per connection the MinRate check with a MeanRate
	// judges, so that connections that closed before the interval ended
	// do not have their bytes divided among the ones still open. Zero
	// means unknown: Bytes / interval / ActiveConns.
	OpenTime time.Duration
}

// Level is one service level of a target: the fraction and weight that new
// connections classified to one policy action are balanced with.
type Level struct {
	Action          string
	Conns           int64 // the action's connections open to the target
	ConnFraction    int   // MaxConnWeightFr: 0, 50, 85 or 100
	MinRateFraction int   // 0 or 100
	// Fraction is max(ConnFraction, MinRateFraction, the default QoS fraction).
	Fraction int
	// Weight is EffectiveWeight(BaseWeight, Fraction), for display; the
	// balancer balances on ExactWeight.
	Weight int
}

// Winner names the partial fraction that decided a target's fraction.
type Winner uint8

// The partial fractions. On a tie the default QoS fraction's part is
// reported (an action wins only with a strictly larger fraction), and
// between an action's two checks WinActionConns before WinMinRate.
const (
	// WinNone: every partial fraction is zero.
	WinNone Winner = iota // none
	// WinActionConns: the connections against an action's MaxConnections
	// (MaxConnWeightFr).
	WinActionConns // maxconn
	// WinMinRate: an action's connections are below MinRate while the
	// action is above 85 % of its MeanRate.
	WinMinRate // minrate
	// WinConstrained: the target's connections reached 90 % of its
	// MaxConnections.
	WinConstrained // constrained
	// WinLossTimeout: the loss and timeout fractions, both nonzero, added.
	WinLossTimeout // loss+timeout
	// WinLoss: the loss-ratio fraction alone.
	WinLoss // loss
	// WinTimeout: the timeout-ratio fraction alone.
	WinTimeout // timeout
	// WinError: the error-ratio fraction (5xx responses) alone.
	WinError // error
	// WinLossError, WinTimeoutError, WinLossTimeoutError: those nonzero
	// fractions added.
	WinLossError        // loss+error
	WinTimeoutError     // timeout+error
	WinLossTimeoutError // loss+timeout+error
)

// winLast is the last Winner, for UnmarshalText.
const winLast = WinLossTimeoutError

// MarshalText encodes w as its String form, so an encoded Explanation reads
// "won": "loss" rather than a number.
func (w Winner) MarshalText() ([]byte, error) { return []byte(w.String()), nil }

// UnmarshalText parses a String form back, so a client of the admin API
// (weir status) can decode an Explanation.
func (w *Winner) UnmarshalText(b []byte) error {
	for v := WinNone; v <= winLast; v++ {
		if v.String() == string(b) {
			*w = v
			return nil
		}
	}
	return fmt.Errorf("unknown winner %q", b)
}

// Explanation is one target's weight for one sampling interval together with
// everything that produced it: the inputs, each partial fraction, which one
// won, and the base and effective weights. It is what the admin API and
// `weir status` show; its fields are exported so the control plane can encode
// it. Rates are in Kbit/s (1000 bit/s), rounded down; ratios in tenths of a
// percent, rounded down; fractions in percent.
type Explanation struct {
	Service string // the virtual server's name
	Target  string // the target's name

	// Inputs.
	Interval       time.Duration
	SegmentsSent   uint64
	Retransmits    uint64
	Timeouts       uint64
	ActiveConns    int64
	MaxConns       int64 // the target's MaxConnections; ≤ 0: none
	ThroughputKbps int64 // the target's Bytes over Interval

	// The default QoS fraction and its parts.
	LossRatio       int  // Retransmits/SegmentsSent in tenths of a percent
	TimeoutRatio    int  // Timeouts/SegmentsSent in tenths of a percent
	LossFraction    int  // LossRatioAndWeightFr steps, capped at LossMax
	TimeoutFraction int  // TimeoutRatioAndWeightFr steps, capped at TimeoutMax
	Held            bool // the noise guard held LossFraction and TimeoutFraction
	// MinSegments is the noise guard the interval was judged with; the
	// Pending counts are the segments, retransmits and timeouts carried to
	// the next interval because they were fewer than MinSegments (0 once
	// judged). LossRatio and TimeoutRatio are over the judged (or, while
	// held, the pending) counts.
	MinSegments        int
	PendingSegments    uint64
	PendingRetransmits uint64
	PendingTimeouts    uint64
	// TimeoutsUnknown: the sample's timeouts were incomplete (see
	// TargetSample.TimeoutsUnknown); TimeoutFraction is the last judged one.
	TimeoutsUnknown bool
	Constrained     bool // ActiveConns reached 90 % of MaxConns
	// DefaultFraction is LossFraction+TimeoutFraction+ErrorFraction capped
	// at 100; 100 if Constrained.
	DefaultFraction int

	// The error part (http services; see Monitor.ErrorThreshold): the
	// interval's responses, those with a 5xx status and the requests that
	// failed before a response, the ratio judged (tenths of a percent, over
	// the judged or, while ErrorHeld, the pending counts) and its fraction.
	// While fewer than MinResponses responses were seen the fraction is
	// held and the counts carried (PendingResponses, PendingErrors), as
	// the loss guard does with segments.
	Responses        uint64
	ServerErrors     uint64
	FailedRequests   uint64
	ErrorRatio       int
	ErrorFraction    int // ErrorRatioAndWeightFr steps, capped at ErrorMax
	ErrorHeld        bool
	MinResponses     int
	PendingResponses uint64
	PendingErrors    uint64

	// The policy action with the largest fraction (the first one on ties);
	// empty Action when the target has no connections under any action.
	Action          string
	ActionConns     int64
	ActionMaxConns  int64
	ActionKbps      int64 // the action's throughput on this target
	PerConnKbps     int64 // ActionKbps / ActionConns
	MinRateKbps     int64
	MeanRateKbps    int64
	ConnFraction    int // MaxConnWeightFr: 0, 50, 85 or 100
	MinRateFraction int // 0 or 100
	ActionFraction  int // max(ConnFraction, MinRateFraction, DefaultFraction)

	// Levels holds one entry per policy action with connections to the
	// target: new connections classified to that action are balanced on
	// its Level's weight, those under no action (and under an action not
	// listed) on DefaultWeight.
	Levels []Level

	// Result.
	Fraction   int // the target's largest fraction: max(DefaultFraction, every ActionFraction)
	Winner     Winner
	BaseWeight int // the target's configured (WLM) weight
	Weight     int // EffectiveWeight(BaseWeight, Fraction): the most cut level
	// DefaultWeight is EffectiveWeight(BaseWeight, DefaultFraction): the
	// weight of connections under no action.
	DefaultWeight int
}

// String renders e as one line for a STATS log entry.
func (e Explanation) String() string {
	b := make([]byte, 0, 256)
	b = append(b, "service="...)
	b = strconv.AppendQuote(b, e.Service)
	b = append(b, " target="...)
	b = strconv.AppendQuote(b, e.Target)
	b = append(b, " weight="...)
	b = strconv.AppendInt(b, int64(e.BaseWeight), 10)
	b = append(b, "->"...)
	b = strconv.AppendInt(b, int64(e.Weight), 10)
	b = append(b, " fraction="...)
	b = strconv.AppendInt(b, int64(e.Fraction), 10)
	b = append(b, "% won="...)
	b = append(b, e.Winner.String()...)
	b = appendRatioPart(b, " loss=", e.LossFraction, e.Retransmits, e.SegmentsSent, e.LossRatio)
	b = appendRatioPart(b, " timeout=", e.TimeoutFraction, e.Timeouts, e.SegmentsSent, e.TimeoutRatio)
	if e.TimeoutsUnknown {
		b = append(b, " timeouts-unknown"...)
	}
	if e.Held {
		b = append(b, " held("...)
		b = strconv.AppendUint(b, e.PendingSegments, 10)
		b = append(b, '<')
		b = strconv.AppendInt(b, int64(e.MinSegments), 10)
		b = append(b, " seg)"...)
	}
	if e.Responses > 0 || e.FailedRequests > 0 || e.ErrorFraction > 0 || e.ErrorHeld {
		b = append(b, " error="...)
		b = strconv.AppendInt(b, int64(e.ErrorFraction), 10)
		b = append(b, "% ("...)
		b = strconv.AppendUint(b, e.ServerErrors, 10)
		b = append(b, '/')
		b = strconv.AppendUint(b, e.Responses, 10)
		b = append(b, " 5xx"...)
		if e.FailedRequests > 0 {
			b = append(b, " failed="...)
			b = strconv.AppendUint(b, e.FailedRequests, 10)
		}
		b = append(b, ' ')
		b = appendTenths(b, e.ErrorRatio)
		b = append(b, ')')
		if e.ErrorHeld {
			b = append(b, " held("...)
			b = strconv.AppendUint(b, e.PendingResponses, 10)
			b = append(b, '<')
			b = strconv.AppendInt(b, int64(e.MinResponses), 10)
			b = append(b, " resp)"...)
		}
	}
	b = append(b, " conns="...)
	b = strconv.AppendInt(b, e.ActiveConns, 10)
	if e.MaxConns > 0 {
		b = append(b, '/')
		b = strconv.AppendInt(b, e.MaxConns, 10)
	}
	if e.Constrained {
		b = append(b, " constrained"...)
	}
	b = append(b, " default="...)
	b = strconv.AppendInt(b, int64(e.DefaultFraction), 10)
	b = append(b, "% rate="...)
	b = strconv.AppendInt(b, e.ThroughputKbps, 10)
	b = append(b, "kbps"...)
	if e.Action != "" {
		b = append(b, " action="...)
		b = strconv.AppendQuote(b, e.Action)
		b = append(b, " fraction="...)
		b = strconv.AppendInt(b, int64(e.ActionFraction), 10)
		b = append(b, "% conns="...)
		b = strconv.AppendInt(b, e.ActionConns, 10)
		if e.ActionMaxConns > 0 {
			b = append(b, '/')
			b = strconv.AppendInt(b, e.ActionMaxConns, 10)
		}
		b = append(b, " maxconn="...)
		b = strconv.AppendInt(b, int64(e.ConnFraction), 10)
		b = append(b, "% rate="...)
		b = strconv.AppendInt(b, e.ActionKbps, 10)
		b = append(b, "kbps/conn="...)
		b = strconv.AppendInt(b, e.PerConnKbps, 10)
		b = append(b, "kbps min="...)
		b = strconv.AppendInt(b, e.MinRateKbps, 10)
		b = append(b, " mean="...)
		b = strconv.AppendInt(b, e.MeanRateKbps, 10)
		b = append(b, " minrate="...)
		b = strconv.AppendInt(b, int64(e.MinRateFraction), 10)
		b = append(b, '%')
	}
	return string(b)
}

// appendTenths appends a ratio in tenths of a percent as a percentage.
func appendTenths(b []byte, tenths int) []byte {
	b = strconv.AppendInt(b, int64(tenths/10), 10)
	b = append(b, '.')
	b = strconv.AppendInt(b, int64(tenths%10), 10)
	return append(b, '%')
}

// RatioTenths returns num/den in tenths of a percent, rounded down, with
// num above den counted as den (100 %). A zero den gives 0.
func RatioTenths(num, den uint64) int {
	if den == 0 {
		return 0
	}
	q, _ := tenths(num, den)
	return int(q)
}

// tenths returns ⌊num·1000/den⌋ and the remainder, exactly, for num ≤ den
// (num above den is clamped). den must be nonzero.
func tenths(num, den uint64) (q, r uint64) {
	if num > den {
		num = den
	}
	hi, lo := bits.Mul64(num, 1000)
	// hi ≤ den·1000/2⁶⁴ < den, so the quotient fits and Div64 cannot panic.
	return bits.Div64(hi, lo, den)
}

// StepFraction is the LossRatioAndWeightFr / TimeoutRatioAndWeightFr rule:
// with the ratio num/den, k is the number of whole thresholds (threshold in
// tenths of a percent) that the ratio strictly exceeds, and the fraction is
// k·step percent, capped at maxFr and at 100. The comparison is exact: with
// threshold 20, exactly 2 % gives 0 and anything above 2 % gives one step.
// A zero den (nothing sent), or a threshold, step or maxFr ≤ 0, gives 0.
func StepFraction(num, den uint64, threshold, step, maxFr int) int {
	if den == 0 || num == 0 || threshold <= 0 || step <= 0 || maxFr <= 0 {
		return 0
	}
	q, r := tenths(num, den)
	// ratio = q + r/den tenths; ratio > j·t ⇔ j·t < q, or j·t = q and r > 0.
	var k uint64
	if r > 0 {
		k = q / uint64(threshold)
	} else if q > 0 {
		k = (q - 1) / uint64(threshold)
	}
	maxFr = min(maxFr, 100)
	switch {
	case k == 0:
		return 0
	case k >= uint64(maxFr) || step >= maxFr: // k·step ≥ maxFr; no overflow
		return maxFr
	}
	return min(int(k)*step, maxFr) // k, step < 100
}

// DefaultFraction is the default QoS fraction: loss + timeout capped at 100,
// or 100 (constrained) when the target's open connections reach
// ConstrainedPercent of its connection limit maxConns (> 0).
func DefaultFraction(loss, timeout int, conns, maxConns int64) (fraction int, constrained bool) {
	if maxConns > 0 && conns > 0 && mulGE(uint64(conns), 100, uint64(maxConns), ConstrainedPercent) {
		return 100, true
	}
	f := clampPercent(loss) + clampPercent(timeout)
	if f > 100 {
		f = 100
	}
	return f, false
}

// ConnFraction is MaxConnWeightFr: with levels L1 L2 L3 (percent of the
// action's limit maxConns), conns reaching L1 % gives 50, reaching L2 % gives
// 85 and reaching L3 % gives 100 ("reaching" is ≥). maxConns ≤ 0 gives 0,
// and a level ≤ 0 is off (an uncompiled Monitor's zero levels do not make
// every connection count as 100 %).
func ConnFraction(levels [3]int, conns, maxConns int64) int {
	if maxConns <= 0 || conns <= 0 {
		return 0
	}
	c, m := uint64(conns), uint64(maxConns)
	for i, f := range [3]int{100, 85, 50} {
		if l := levels[2-i]; l > 0 && mulGE(c, 100, m, uint64(l)) {
			return f
		}
	}
	return 0
}

// MinRateFraction is the MinRate check of an action whose conns
// connections carried bytes over interval; it is 100 when the minimum
// per-connection rate is not met, otherwise 0. Rates are compared in whole
// bits per second.
//
// With a MeanRate (the seed's rule) conns and bytes are all the action's
// flows to the target, and the check trips when the action's throughput is
// above MinRateBusyPercent of MeanRate and the average per connection is
// below MinRate. (Explain, given the flows' OpenTime, takes the average per
// connection as bytes / OpenTime instead of bytes / interval / conns: see
// actionMinRate.)
//
// Without a MeanRate (the seed's own telnetGold has MinRate 500 alone) there
// is no mean to say the service is busy, so the connections themselves must
// say it: the caller passes only the flows that had data waiting to be sent
// during the interval (ActionSample.WaitingConns, WaitingBytes; Explain
// divides by WaitingTime, the time their data was moving, when it is
// known), and the check trips when their average is below MinRate. An idle
// or interactive session has nothing waiting and is never judged "slow"; a
// session whose sender had a backlog and still moved less than MinRate is,
// however gappy a shared, capped link makes its data (netstack judges
// "waiting" by the bytes each read brings for the pause before it, not by
// a fixed pause; see its StreamRate).
func MinRateFraction(a *Action, conns int64, bytes uint64, interval time.Duration) int {
	if a == nil || a.MinRate <= 0 || a.MeanRate < 0 || conns <= 0 || interval <= 0 {
		return 0
	}
	bps := bitsPerSecond(bytes, interval)
	busy := a.MeanRate == 0 || mulGT(bps, 100, uint64(a.MeanRate), 1000*MinRateBusyPercent)
	// ⌊bps/conns⌋ < MinRate·1000 ⇔ bps < MinRate·1000·conns for integers.
	starved := mulLT(bps/uint64(conns), 1, uint64(a.MinRate), 1000)
	if busy && starved {
		return 100
	}
	return 0
}

// actionMinRate applies MinRateFraction to an action's sample: all its flows
// with a MeanRate, the flows with data waiting without one.
func actionMinRate(as *ActionSample, interval time.Duration) int {
	if as.Action != nil && as.Action.MeanRate == 0 {
		if as.WaitingConns > 0 && as.WaitingTime > 0 {
			// Per flow over the time its data was moving: a short
			// transfer that closed early, or paused, is judged by its own
			// rate, not the interval's.
			return MinRateFraction(as.Action, 1, as.WaitingBytes, as.WaitingTime)
		}
		return MinRateFraction(as.Action, as.WaitingConns, as.WaitingBytes, interval)
	}
	if a := as.Action; as.OpenTime > 0 && a != nil && a.MinRate > 0 && a.MeanRate > 0 && as.ActiveConns > 0 && interval > 0 {
		// The rate per connection is the interval's bytes over the sum of
		// each connection's time open in it: 20 connections at 45 Kbit/s
		// read 45 Kbit/s each whether all stay open or 19 close before
		// the interval ends (divided by the 1 still open, 900).
		busy := mulGT(bitsPerSecond(as.Bytes, interval), 100, uint64(a.MeanRate), 1000*MinRateBusyPercent)
		if busy && mulLT(bitsPerSecond(as.Bytes, as.OpenTime), 1, uint64(a.MinRate), 1000) {
			return 100
		}
		return 0
	}
	return MinRateFraction(as.Action, as.ActiveConns, as.Bytes, interval)
}

// ExactWeight is the weight the balancer balances on: base·(100−fraction),
// the effective weight in hundredths of a WLM weight, without rounding. The
// balancer reduces its weights by their greatest common divisor, so an uncut
// table balances on the WLM weights themselves, and a weight-1 target at 25 %
// (75) gets exactly ¾ of an uncut weight-1 target's (100) share. A negative
// base counts as 0; fraction is clamped to 0..100; the result saturates at
// MaxInt32 (the WLM weight is at most 1000 in a parsed config).
func ExactWeight(base, fraction int) int {
	if base <= 0 {
		return 0
	}
	w := uint64(base) * uint64(100-clampPercent(fraction))
	return int(min(w, math.MaxInt32))
}

// EffectiveWeight is the WLM weight base cut by fraction percent, in whole
// weights for display: ⌊base·(100−fraction)/100⌋ (40 at 50 % is 20), but at
// least 1 while the fraction is below 100 (only 100 % takes a target out of
// the rotation). The balancer does not balance on it but on ExactWeight, so
// the rounding never changes a share. A negative base counts as 0; fraction
// is clamped to 0..100.
func EffectiveWeight(base, fraction int) int {
	if base <= 0 {
		return 0
	}
	f := clampPercent(fraction)
	if f == 100 {
		return 0
	}
	hi, lo := bits.Mul64(uint64(base), uint64(100-f))
	w, _ := bits.Div64(hi, lo, 100) // hi < 100: base < 2⁶³ and 100−f ≤ 100
	if w == 0 {
		return 1
	}
	return int(w)
}

// Explain computes one target's fractions and weights for one sampling
// interval: the default level's and one Level per policy action with
// connections to the target. m must be a compiled Monitor (its zero
// thresholds mean "off" here, not the defaults); t is the target (its Weight
// and MaxConnections); s is the interval's sample; prev is the target's
// previous explanation, nil for its first interval, used by the noise guard
// (see MinSegments). Explain allocates only Levels.
func Explain(m *Monitor, t *Target, s *TargetSample, prev *Explanation) Explanation {
	e := Explanation{
		Target:       t.Name,
		Interval:     s.Interval,
		SegmentsSent: s.SegmentsSent,
		Retransmits:  s.Retransmits,
		Timeouts:     s.Timeouts,
		ActiveConns:  s.ActiveConns,
		MaxConns:     t.MaxConnections,
		BaseWeight:   t.Weight,
	}
	if e.Interval <= 0 {
		e.Interval = m.SamplingInterval
	}
	e.ThroughputKbps = kbps(s.Bytes, e.Interval)
	judgeRatios(m, &e, s.SegmentsSent, s.Retransmits, s.Timeouts, s.TimeoutsUnknown, prev)
	judgeErrors(m, &e, s, prev)
	e.DefaultFraction, e.Constrained = DefaultFraction(e.LossFraction, e.TimeoutFraction, s.ActiveConns, t.MaxConnections)
	if !e.Constrained {
		// The error part adds to loss and timeout under the same cap.
		e.DefaultFraction = min(e.DefaultFraction+clampPercent(e.ErrorFraction), 100)
	}
	e.Fraction = e.DefaultFraction
	if e.Constrained {
		e.Winner = WinConstrained
	} else {
		e.Winner = partsWinner(e.LossFraction > 0, e.TimeoutFraction > 0, e.ErrorFraction > 0)
	}

	best := -1
	e.Levels = nil
	for i := range s.Actions {
		as := &s.Actions[i]
		if as.ActiveConns <= 0 || as.Action == nil {
			continue
		}
		cf := ConnFraction(m.MaxConnLevels, as.ActiveConns, as.Action.MaxConnections)
		mf := actionMinRate(as, e.Interval)
		af := max(cf, mf, e.DefaultFraction)
		e.Levels = append(e.Levels, Level{
			Action: as.Action.Name, Conns: as.ActiveConns, ConnFraction: cf, MinRateFraction: mf,
			Fraction: af, Weight: EffectiveWeight(e.BaseWeight, af),
		})
		if af <= best {
			continue
		}
		best = af
		a := as.Action
		e.Action = a.Name
		e.ActionConns = as.ActiveConns
		e.ActionMaxConns = a.MaxConnections
		e.ActionKbps = kbps(as.Bytes, e.Interval)
		e.PerConnKbps = e.ActionKbps / as.ActiveConns
		if as.OpenTime > 0 {
			e.PerConnKbps = kbps(as.Bytes, as.OpenTime)
		}
		e.MinRateKbps = a.MinRate
		e.MeanRateKbps = a.MeanRate
		e.ConnFraction = cf
		e.MinRateFraction = mf
		e.ActionFraction = af
		if af > e.Fraction {
			e.Fraction = af
			if cf >= mf {
				e.Winner = WinActionConns
			} else {
				e.Winner = WinMinRate
			}
		}
	}
	e.DefaultWeight = EffectiveWeight(e.BaseWeight, e.DefaultFraction)
	e.Weight = EffectiveWeight(e.BaseWeight, e.Fraction)
	return e
}

// judgeRatios applies the noise guard and the loss and timeout steps to one
// interval's counts (see MinSegments): it adds them to what prev left
// pending, judges the ratios once the pending segments reach
// m.MinSegments, and otherwise holds the last judged fractions.
func judgeRatios(m *Monitor, e *Explanation, segs, retrans, timeouts uint64, unknown bool, prev *Explanation) {
	guard := uint64(max(m.MinSegments, 1))
	if m.MinSegments == 0 {
		guard = DefaultMinSegments
	}
	e.MinSegments = int(guard)
	e.TimeoutsUnknown = unknown
	var lastLoss, lastTimeout int
	silent := segs == 0
	if prev != nil {
		lastLoss, lastTimeout = prev.LossFraction, prev.TimeoutFraction
		segs += prev.PendingSegments
		retrans += prev.PendingRetransmits
		timeouts += prev.PendingTimeouts
	}
	e.LossRatio = RatioTenths(retrans, segs)
	e.TimeoutRatio = RatioTenths(timeouts, segs)
	if segs < guard {
		e.Held = true
		e.PendingSegments, e.PendingRetransmits, e.PendingTimeouts = segs, retrans, timeouts
		e.LossFraction, e.TimeoutFraction = lastLoss, lastTimeout
		if silent {
			// Silent: nothing to judge, and nothing ever will be if the
			// cut keeps connections away; step back toward the full weight.
			e.LossFraction = max(lastLoss-max(m.LossStep, 1), 0)
			e.TimeoutFraction = max(lastTimeout-max(m.TimeoutStep, 1), 0)
		}
		return
	}
	e.LossFraction = StepFraction(retrans, segs, m.LossThreshold, m.LossStep, m.LossMax)
	if unknown {
		// Missing RTO counts are not evidence of no timeouts: keep the last
		// judged timeout fraction rather than read them as 0 %.
		e.TimeoutFraction = lastTimeout
	} else {
		e.TimeoutFraction = StepFraction(timeouts, segs, m.TimeoutThreshold, m.TimeoutStep, m.TimeoutMax)
	}
}

// partsWinner names the default fraction's nonzero parts.
func partsWinner(loss, timeout, errs bool) Winner {
	return [8]Winner{WinNone, WinLoss, WinTimeout, WinLossTimeout, WinError, WinLossError, WinTimeoutError, WinLossTimeoutError}[b2i(loss)|b2i(timeout)<<1|b2i(errs)<<2]
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// judgeErrors is the error part, the seed's step rule one layer up: the
// interval's 5xx responses (and, with m.ErrorCountsFailures, the requests
// that failed before a response) over its responses, added to what prev
// left pending, become ErrorRatioAndWeightFr steps capped at ErrorMax once
// at least m.MinResponses responses are counted. Fewer hold the last
// fraction and carry the counts, as judgeRatios does with segments; an
// interval with no request at all (a target cut to 100 % gets none) lowers
// the fraction by one step, so it regains its weight after ⌈max/step⌉
// silent intervals. m.ErrorThreshold 0 turns the part off.
func judgeErrors(m *Monitor, e *Explanation, s *TargetSample, prev *Explanation) {
	e.Responses, e.ServerErrors, e.FailedRequests = s.Responses, s.ServerErrors, s.FailedRequests
	if m.ErrorThreshold <= 0 || m.ErrorStep <= 0 {
		return
	}
	resp, errs := s.Responses, s.ServerErrors
	if m.ErrorCountsFailures {
		resp += s.FailedRequests
		errs += s.FailedRequests
	}
	guard := uint64(max(m.MinResponses, 1))
	if m.MinResponses == 0 {
		guard = DefaultMinResponses
	}
	e.MinResponses = int(guard)
	silent := resp == 0
	last := 0
	if prev != nil {
		last = prev.ErrorFraction
		resp += prev.PendingResponses
		errs += prev.PendingErrors
	}
	e.ErrorRatio = RatioTenths(errs, resp)
	errMax := m.ErrorMax
	if errMax == 0 {
		errMax = DefaultErrorMax
	}
	if resp < guard {
		e.ErrorHeld = true
		e.PendingResponses, e.PendingErrors = resp, errs
		e.ErrorFraction = last
		if silent {
			e.ErrorFraction = max(last-m.ErrorStep, 0)
		}
		return
	}
	e.ErrorFraction = StepFraction(errs, resp, m.ErrorThreshold, m.ErrorStep, errMax)
}

// bitsPerSecond returns bytes·8 over d in whole bits per second, saturating.
func bitsPerSecond(bytes uint64, d time.Duration) uint64 {
	if d <= 0 {
		return 0
	}
	hi, lo := bits.Mul64(bytes, 8*uint64(time.Second))
	if hi >= uint64(d) {
		return math.MaxUint64
	}
	q, _ := bits.Div64(hi, lo, uint64(d))
	return q
}

// kbps returns bytes over d in Kbit/s, rounded down and saturating (at
// MaxUint64/1000, which fits an int64).
func kbps(bytes uint64, d time.Duration) int64 {
	return int64(bitsPerSecond(bytes, d) / 1000)
}

// mulGE reports a·b ≥ c·d exactly.
func mulGE(a, b, c, d uint64) bool { return !mulLT(a, b, c, d) }

// mulGT reports a·b > c·d exactly.
func mulGT(a, b, c, d uint64) bool { return mulLT(c, d, a, b) }

// mulLT reports a·b < c·d exactly.
func mulLT(a, b, c, d uint64) bool {
	h1, l1 := bits.Mul64(a, b)
	h2, l2 := bits.Mul64(c, d)
	return h1 < h2 || (h1 == h2 && l1 < l2)
}

func clampPercent(f int) int {
	return min(max(f, 0), 100)
}

// appendRatioPart appends one ratio fraction as `name<fraction>% (num/den seg
// <ratio>%)`, the form the loss and timeout parts share in String.
func appendRatioPart(b []byte, name string, fraction int, num, den uint64, tenths int) []byte {
	b = append(b, name...)
	b = strconv.AppendInt(b, int64(fraction), 10)
	b = append(b, "% ("...)
	b = strconv.AppendUint(b, num, 10)
	b = append(b, '/')
	b = strconv.AppendUint(b, den, 10)
	b = append(b, " seg "...)
	b = appendTenths(b, tenths)
	return append(b, ')')
}
