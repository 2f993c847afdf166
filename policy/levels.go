package policy

// LevelFractions are one service's QoS fractions as its balancer takes
// them (balancer.SetFractions): the default level's by target (connections
// under no policy action), and one level per policy action, by action and
// target.
type LevelFractions struct {
	Default  map[string]int
	ByAction map[string]map[string]int
}

// ServiceFractions gathers one sampling interval's explanations into each of
// cfg's services' level fractions (explanations of services cfg no longer
// has are left out). An action level has every target of the service: one
// without connections under the action is balanced there on its default
// fraction. With the monitor off every fraction is 0 (empty maps), so the
// balancers go back to the configured weights at once rather than keeping
// the last cut ones.
func ServiceFractions(cfg *Config, expl []Explanation) map[string]LevelFractions {
	by := make(map[string]LevelFractions, len(cfg.Services))
	for _, vs := range cfg.Services {
		by[vs.Name] = LevelFractions{Default: map[string]int{}, ByAction: map[string]map[string]int{}}
	}
	if !cfg.Monitor.Enabled {
		return by
	}
	for _, e := range expl {
		l, ok := by[e.Service]
		if !ok {
			continue
		}
		l.Default[e.Target] = e.DefaultFraction
		for _, lv := range e.Levels {
			m := l.ByAction[lv.Action]
			if m == nil {
				m = map[string]int{}
				l.ByAction[lv.Action] = m
			}
			m[e.Target] = lv.Fraction
		}
	}
	for _, l := range by {
		for _, m := range l.ByAction {
			for name, f := range l.Default {
				if _, ok := m[name]; !ok {
					m[name] = f
				}
			}
		}
	}
	return by
}
