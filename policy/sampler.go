package policy

// TargetKey names a target across reloads: its virtual server's name and its
// own name.
type TargetKey struct {
	Service string
	Target  string
}

// Sampler turns each sampling interval's measurements into the weights and
// explanations of every target of every virtual server. It remembers each
// target's previous explanation, keyed by TargetKey, for the noise guard (see
// MinSegments); that memory survives a reload for every name still present
// and is dropped for names that are gone.
//
// A Sampler is used by one goroutine (the sampling loop); it is not safe for
// concurrent use. The zero value is ready to use.
type Sampler struct {
	prev    map[TargetKey]Explanation
	cfg     *Config            // the config actions was built for
	actions map[string]*Action // cfg's actions by name
	scratch []ActionSample
}

// NewSampler returns an empty Sampler.
func NewSampler() *Sampler { return &Sampler{} }

// Sample computes the explanations for one interval. cfg is the current
// compiled Config; samples holds each target's measurements for the interval
// (a target missing from it had no traffic: a zero sample, which the noise
// guard treats as a quiet interval). Each ActionSample's action is looked up
// by name in cfg, so flows classified before a reload are judged by the
// current action of that name; a name cfg no longer has keeps the sample's
// action.
//
// The explanations are appended to dst in configuration order (virtual
// servers in file order, each one's targets in order) and returned. With the
// monitor disabled (cfg.Monitor.Enabled false) every fraction is 0 and every
// weight is its base weight, but the inputs are still explained.
func (s *Sampler) Sample(cfg *Config, samples map[TargetKey]*TargetSample, dst []Explanation) []Explanation {
	if s.prev == nil {
		s.prev = make(map[TargetKey]Explanation)
	}
	if s.cfg != cfg {
		s.cfg = cfg
		s.actions = make(map[string]*Action, len(cfg.Actions))
		for _, a := range cfg.Actions {
			s.actions[a.Name] = a
		}
	}
	seen := make(map[TargetKey]bool, len(s.prev))
	var zero TargetSample
	for _, vs := range cfg.Services {
		for _, t := range vs.Targets {
			k := TargetKey{vs.Name, t.Name}
			seen[k] = true
			smp := samples[k]
			if smp == nil {
				smp = &zero
			}
			in := *smp
			in.Actions = s.resolve(smp.Actions)
			var prev *Explanation
			if p, ok := s.prev[k]; ok {
				prev = &p
			}
			var e Explanation
			if cfg.Monitor.Enabled {
				e = Explain(&cfg.Monitor, t, &in, prev)
			} else {
				e = Explain(&Monitor{SamplingInterval: cfg.Monitor.SamplingInterval}, t, &in, nil)
				e.LossFraction, e.TimeoutFraction, e.Held = 0, 0, false
				e.ErrorFraction, e.ErrorHeld = 0, false
				e.DefaultFraction, e.Constrained = 0, false
				e.ConnFraction, e.MinRateFraction, e.ActionFraction = 0, 0, 0
				e.Fraction, e.Winner, e.Weight = 0, WinNone, max(e.BaseWeight, 0)
			}
			e.Service = vs.Name
			s.prev[k] = e
			dst = append(dst, e)
		}
	}
	for k := range s.prev {
		if !seen[k] {
			delete(s.prev, k)
		}
	}
	return dst
}

// resolve returns as with each action replaced by the current config's
// action of the same name, in a scratch slice reused across calls.
func (s *Sampler) resolve(as []ActionSample) []ActionSample {
	s.scratch = append(s.scratch[:0], as...)
	for i := range s.scratch {
		if a := s.scratch[i].Action; a != nil {
			if cur, ok := s.actions[a.Name]; ok {
				s.scratch[i].Action = cur
			}
		}
	}
	return s.scratch
}
