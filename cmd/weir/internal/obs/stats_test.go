package obs

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"weir/balancer"
	"weir/cmd/weir/api"
	"weir/policy"
)

// TestStatsLine: a target's STATS line carries its segment counts and
// pending requests, and each action level of its service in the actions
// field and the message, a target missing from a level at fraction 0.
func TestStatsLine(t *testing.T) {
	var buf bytes.Buffer
	log := zerolog.New(&buf)
	e := &policy.Explanation{Service: "web", Target: "t1", BaseWeight: 4, Weight: 4}
	sg := api.Segments{Direction: "from_target", FromTarget: api.DirTotals{DataSegments: 100, Retransmitted: 3, Source: "measured"}}
	fr := map[string]map[string]int{"silver": {"t2": 30}, "gold": {"t1": 50}}
	Stats(&log, e, sg, fr, 7)
	var line struct {
		Message  string                    `json:"message"`
		Segs     uint64                    `json:"from_target_segs"`
		Retrans  uint64                    `json:"from_target_retrans"`
		Pending  int64                     `json:"pending_requests"`
		Actions  map[string]map[string]int `json:"actions"`
		Level    string                    `json:"level"`
		Service  string                    `json:"service"`
		Source   string                    `json:"from_target_source"`
		Target   string                    `json:"target"`
		Dir      string                    `json:"direction"`
		Weight   int                       `json:"weight"`
		Effected int                       `json:"effective"`
	}
	if err := json.Unmarshal(buf.Bytes(), &line); err != nil {
		t.Fatalf("%v: %s", err, buf.Bytes())
	}
	gw, sw := policy.EffectiveWeight(4, 50), policy.EffectiveWeight(4, 0)
	want := fmt.Sprintf(" levels=gold:50%%->%d,silver:0%%->%d", gw, sw)
	if !strings.HasPrefix(line.Message, "STATS ") || !strings.HasSuffix(line.Message, want) {
		t.Errorf("message %q, want STATS ... %q", line.Message, want)
	}
	if line.Segs != 100 || line.Retrans != 3 || line.Pending != 7 || line.Source != "measured" || line.Dir != "from_target" ||
		line.Service != "web" || line.Target != "t1" || line.Level != "info" {
		t.Errorf("line %+v", line)
	}
	if g := line.Actions["gold"]; g["fraction"] != 50 || g["effective"] != gw || line.Actions["silver"]["fraction"] != 0 {
		t.Errorf("actions %v", line.Actions)
	}

	buf.Reset()
	Stats(&log, e, sg, nil, 0)
	if strings.Contains(buf.String(), "levels=") {
		t.Errorf("a service without action levels: %s", buf.Bytes())
	}
}

// TestLimitEvent: an excess is a warning, the return under it info, both
// with the limit's fields and the Sun-style text.
func TestLimitEvent(t *testing.T) {
	var buf bytes.Buffer
	log := zerolog.New(&buf)
	e := policy.Event{Level: policy.LevelClass, Name: "gold", Limit: policy.LimitMaxConnections, Value: 10, Measured: 12, Over: true}
	LimitEvent(&log, e)
	e.Over, e.Measured = false, 9
	LimitEvent(&log, e)
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("%d lines: %s", len(lines), buf.Bytes())
	}
	for i, want := range []string{"warn", "info"} {
		var l struct {
			Level, Name, Message string
			Value, Measured      int64
		}
		if err := json.Unmarshal([]byte(lines[i]), &l); err != nil {
			t.Fatal(err)
		}
		if l.Level != want || l.Name != "gold" || l.Value != 10 || !strings.HasPrefix(l.Message, "qos: ") {
			t.Errorf("line %d: %+v, want level %s", i, l, want)
		}
	}
}

// TestSkipLog: a target passed over at its limit is warned of once per
// interval with the count since the last one; a quiet interval writes
// nothing, and each service's targets are counted apart.
func TestSkipLog(t *testing.T) {
	var buf bytes.Buffer
	log := zerolog.New(&buf)
	var s SkipLog
	lines := func() []string {
		defer buf.Reset()
		if buf.Len() == 0 {
			return nil
		}
		return strings.Split(strings.TrimSpace(buf.String()), "\n")
	}
	s.Log(&log, "web", []balancer.TargetStatus{{Name: "t1", SkippedAtLimit: 3, Open: 2, Max: 2}, {Name: "t2"}})
	if l := lines(); len(l) != 1 || !strings.Contains(l[0], `"skipped":3`) || !strings.Contains(l[0], "target t1 has reached maximum connections") {
		t.Errorf("first interval: %q", l)
	}
	s.Log(&log, "web", []balancer.TargetStatus{{Name: "t1", SkippedAtLimit: 3}, {Name: "t2"}})
	if l := lines(); len(l) != 0 {
		t.Errorf("quiet interval: %q", l)
	}
	s.Log(&log, "api", []balancer.TargetStatus{{Name: "t1", SkippedAtLimit: 1}})
	s.Log(&log, "web", []balancer.TargetStatus{{Name: "t1", SkippedAtLimit: 5}})
	if l := lines(); len(l) != 2 || !strings.Contains(l[0], `"service":"api"`) || !strings.Contains(l[1], `"skipped":2`) {
		t.Errorf("third interval: %q", l)
	}
}

// TestStatsLineErrorPart: an http target's error part is in its STATS
// line, as fields and in the message.
func TestStatsLineErrorPart(t *testing.T) {
	var buf bytes.Buffer
	log := zerolog.New(&buf)
	e := &policy.Explanation{Service: "web", Target: "t1", BaseWeight: 4, Weight: 3, Fraction: 25, DefaultFraction: 25,
		Winner: policy.WinError, Responses: 100, ServerErrors: 10, ErrorRatio: 100, ErrorFraction: 25}
	Stats(&log, e, api.Segments{}, nil, 0)
	var line struct {
		Message   string `json:"message"`
		Responses uint64 `json:"responses"`
		Errors    uint64 `json:"server_errors"`
		ErrorFr   int    `json:"error_fr"`
		Winner    string `json:"winner"`
	}
	if err := json.Unmarshal(buf.Bytes(), &line); err != nil {
		t.Fatalf("%v: %s", err, buf.Bytes())
	}
	if line.Responses != 100 || line.Errors != 10 || line.ErrorFr != 25 || line.Winner != "error" ||
		!strings.Contains(line.Message, "won=error") || !strings.Contains(line.Message, "error=25% (10/100 5xx 10.0%)") {
		t.Errorf("STATS line %s", buf.Bytes())
	}
}
