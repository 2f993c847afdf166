package appliance

import (
	"testing"

	"weir/netstack/proxy"
	udprelay "weir/netstack/proxy/udp"
	"weir/policy"
	"weir/policy/config"
)

// TestUDPAnswersCutWeight: a udp target's unanswered request/response
// sessions are its timeout ratio, which the z/OS timeout fraction turns
// into a weight cut unchanged; a target that answered everything keeps its
// weight.
func TestUDPAnswersCutWeight(t *testing.T) {
	cfg, err := config.ParseYAML("t.yaml", []byte(`services:
- {name: dns, vips: [198.18.0.53], port: 53, protocol: udp, udp: {responses: 1},
   targets: [{name: dead, address: "198.18.1.1:53"}, {name: live, address: "198.18.1.2:53"}]}
monitor: {timeoutRatioAndWeightFr: [50, 50], minSegments: 100, scope: all}
`))
	if err != nil {
		t.Fatal(err)
	}
	samples := samplesFrom(cfg, proxy.Sample{}, nil, false)
	addAnswers(cfg, samples, map[udprelay.TargetKey]udprelay.Answers{
		{Service: "dns", Target: "dead"}: {Sessions: 200, Unanswered: 100},
		{Service: "dns", Target: "live"}: {Sessions: 200},
		{Service: "gone", Target: "x"}:   {Sessions: 5, Unanswered: 5},
	})
	dead := samples[policy.TargetKey{Service: "dns", Target: "dead"}]
	if dead.SegmentsSent != 200 || dead.Timeouts != 100 {
		t.Fatalf("dead's sample %+v, want 200 segments, 100 timeouts", dead)
	}
	// Scope policy (the default) judges only sessions a rule matched:
	// none here.
	cfg.Monitor.Scope = policy.ScopePolicy
	none := samplesFrom(cfg, proxy.Sample{}, nil, false)
	addAnswers(cfg, none, map[udprelay.TargetKey]udprelay.Answers{{Service: "dns", Target: "dead"}: {Sessions: 200, Unanswered: 100}})
	if d := none[policy.TargetKey{Service: "dns", Target: "dead"}]; d.SegmentsSent != 0 {
		t.Errorf("scope policy counted sessions no rule matched: %+v", d)
	}
	cfg.Monitor.Scope = policy.ScopeAll
	expl := policy.NewSampler().Sample(cfg, samples, nil)
	fr := map[string]int{}
	for _, e := range expl {
		fr[e.Target] = e.TimeoutFraction
	}
	if fr["dead"] < 50 || fr["live"] != 0 {
		t.Errorf("timeout fractions %v: want dead cut (50 %% unanswered over a 5 %% threshold), live not", fr)
	}
}
