package policy

import (
	"reflect"
	"testing"
)

// TestServiceFractions: each service's default level and action levels
// from the explanations, a target without connections under an action at
// its default fraction there, explanations of a service gone ignored, and
// every map empty with the monitor off.
func TestServiceFractions(t *testing.T) {
	cfg := &Config{Monitor: Monitor{Enabled: true}, Services: []*VirtualServer{{Name: "web"}, {Name: "idle"}}}
	expl := []Explanation{
		{Service: "web", Target: "t1", DefaultFraction: 10, Levels: []Level{{Action: "gold", Fraction: 85}}},
		{Service: "web", Target: "t2", DefaultFraction: 20},
		{Service: "gone", Target: "x", DefaultFraction: 50},
	}
	got := ServiceFractions(cfg, expl)
	want := map[string]LevelFractions{
		"web": {Default: map[string]int{"t1": 10, "t2": 20},
			ByAction: map[string]map[string]int{"gold": {"t1": 85, "t2": 20}}},
		"idle": {Default: map[string]int{}, ByAction: map[string]map[string]int{}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ServiceFractions = %v, want %v", got, want)
	}
	cfg.Monitor.Enabled = false
	for name, l := range ServiceFractions(cfg, expl) {
		if len(l.Default) != 0 || len(l.ByAction) != 0 {
			t.Errorf("monitor off: %s has %v", name, l)
		}
	}
}
