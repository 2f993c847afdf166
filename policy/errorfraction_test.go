package policy

import (
	"net/netip"
	"strings"
	"testing"
	"time"
)

// errorConfig is one http service with targets a and b (weight 40) and the
// monitor's error part at errorRatioAndWeightFr [threshold, step] and
// errorMaxWeightFr max (0: the default).
func errorConfig(t *testing.T, threshold, step, max int) *Config {
	t.Helper()
	vs := &VirtualServer{Name: "web", Proto: ProtoHTTP, VIPs: []netip.Addr{netip.MustParseAddr("10.0.0.1")}, Ports: PortRange{80, 80},
		Targets: []*Target{{Name: "a", Weight: 40}, {Name: "b", Weight: 40}}}
	c, err := Compile(&Config{Services: []*VirtualServer{vs},
		Monitor: Monitor{Enabled: true, SamplingInterval: time.Second, ErrorThreshold: threshold, ErrorStep: step, ErrorMax: max}})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// The sampling intervals follow one another on the Sampler's memory alone:
// each Sample call is one interval of the manual clock.
func TestErrorFractionSteps(t *testing.T) {
	c := errorConfig(t, 50, 25, 75) // above 5 %: 25 % per step, at most 75 %
	if c.Monitor.MinResponses != DefaultMinResponses {
		t.Fatalf("errorMinResponses default %d, want %d", c.Monitor.MinResponses, DefaultMinResponses)
	}
	var s Sampler
	a := TargetKey{"web", "a"}
	for i, tc := range []struct {
		resp, errs, failed uint64
		fraction           int
		held               bool
		winner             Winner
	}{
		{1000, 50, 0, 0, false, WinNone},   // exactly 5 %: not above
		{1000, 51, 0, 25, false, WinError}, // above 5 %: one step
		{1000, 100, 0, 25, false, WinError},
		{1000, 101, 0, 50, false, WinError},
		{1000, 900, 0, 75, false, WinError}, // capped at errorMaxWeightFr
		{10, 10, 0, 75, true, WinError},     // 10 < 20 responses: held, carried
		{10, 0, 0, 75, false, WinError},     // with the pending 10: 10/20 = 50 %, capped
		{0, 0, 0, 50, true, WinError},       // silent (cut out): one step down
		{0, 0, 0, 25, true, WinError},
		{0, 0, 0, 0, true, WinNone},
		{1000, 0, 500, 0, false, WinNone}, // failures do not count by default
		{1000, 200, 0, 75, false, WinError},
		{1000, 0, 0, 0, false, WinNone}, // healed: one interval
	} {
		out := s.Sample(c, map[TargetKey]*TargetSample{a: {Responses: tc.resp, ServerErrors: tc.errs, FailedRequests: tc.failed}}, nil)
		e := out[0]
		if e.ErrorFraction != tc.fraction || e.ErrorHeld != tc.held || e.Winner != tc.winner || e.Fraction != tc.fraction {
			t.Errorf("interval %d (%d/%d 5xx): error %d%% held %v won %v total %d%%, want %d%% %v %v", i, tc.errs, tc.resp,
				e.ErrorFraction, e.ErrorHeld, e.Winner, e.Fraction, tc.fraction, tc.held, tc.winner)
		}
		if out[1].ErrorFraction != 0 || out[1].Fraction != 0 {
			t.Errorf("interval %d: b without requests cut to %d%%", i, out[1].Fraction)
		}
	}
}

func TestErrorFractionAddsAndCaps(t *testing.T) {
	c := errorConfig(t, 50, 25, 0) // errorMaxWeightFr default 100
	if c.Monitor.ErrorMax != DefaultErrorMax {
		t.Fatalf("errorMaxWeightFr default %d, want %d", c.Monitor.ErrorMax, DefaultErrorMax)
	}
	var s Sampler
	k := TargetKey{"web", "a"}
	// Loss 2.1 % (25) and errors 10.1 % (50): 75, both named.
	out := s.Sample(c, map[TargetKey]*TargetSample{k: {SegmentsSent: 1000, Retransmits: 21, Responses: 1000, ServerErrors: 101}}, nil)
	if e := out[0]; e.LossFraction != 25 || e.ErrorFraction != 50 || e.DefaultFraction != 75 || e.Winner != WinLossError || e.Weight != 10 {
		t.Errorf("loss+error: loss %d error %d default %d won %v weight %d, want 25 50 75 loss+error 10", e.LossFraction, e.ErrorFraction, e.DefaultFraction, e.Winner, e.Weight)
	}
	if s := out[0].String(); !strings.Contains(s, "won=loss+error") || !strings.Contains(s, "error=50% (101/1000 5xx 10.1%)") {
		t.Errorf("STATS line %q: want the error part", s)
	}
	// Loss 95 and errors 100: capped at 100, the target out.
	out = s.Sample(c, map[TargetKey]*TargetSample{k: {SegmentsSent: 1000, Retransmits: 500, Timeouts: 60, Responses: 100, ServerErrors: 100}}, nil)
	if e := out[0]; e.DefaultFraction != 100 || e.Weight != 0 || e.Winner != WinLossTimeoutError {
		t.Errorf("capped: default %d weight %d won %v, want 100 0 loss+timeout+error", e.DefaultFraction, e.Weight, e.Winner)
	}
	// Failures before a response count with errorCountsFailures.
	c.Monitor.ErrorCountsFailures = true
	out = s.Sample(c, map[TargetKey]*TargetSample{k: {Responses: 900, FailedRequests: 100}}, nil)
	if e := out[0]; e.ErrorRatio != 100 || e.ErrorFraction != 25 {
		t.Errorf("failures counted: ratio %d error %d, want 100 (10.0 %%) 25", e.ErrorRatio, e.ErrorFraction)
	}
}

func TestErrorFractionOffByDefault(t *testing.T) {
	c := errorConfig(t, 0, 0, 0)
	var s Sampler
	out := s.Sample(c, map[TargetKey]*TargetSample{{"web", "a"}: {Responses: 100, ServerErrors: 100}}, nil)
	if e := out[0]; e.ErrorFraction != 0 || e.Fraction != 0 || e.Responses != 100 || e.ServerErrors != 100 {
		t.Errorf("no errorRatioAndWeightFr: error %d total %d (inputs %d/%d), want 0 0 with the inputs explained", e.ErrorFraction, e.Fraction, e.ServerErrors, e.Responses)
	}
	for _, w := range []Winner{WinError, WinLossError, WinTimeoutError, WinLossTimeoutError} {
		var back Winner
		b, _ := w.MarshalText()
		if err := back.UnmarshalText(b); err != nil || back != w {
			t.Errorf("%v round trip: %v %v", w, back, err)
		}
	}
}
