package appliance

import (
	"time"

	"weir/cmd/weir/internal/obs"
	"weir/netstack/proxy"
	"weir/policy"
)

// recomputeLoop runs in its own goroutine: every RecomputeInterval the
// admission reads the datapath's running byte totals (the engine is its
// policy.ByteTotals: the byte path from the meters to the limits; an http
// request's bytes come from the proxy, policy.Ticket.AddBytes) and
// recomputes the bandwidths; then each limit crossing is logged once and
// the access log flushed.
func (a *Appliance) recomputeLoop() {
	a.every(func(c *policy.Config) time.Duration { return c.Instance.RecomputeInterval }, a.RecomputeNow)
}

// RecomputeNow runs one recompute step at once: the loop calls it every
// RecomputeInterval; tests call it to step the bandwidth windows on their
// own clock (Options.Now).
func (a *Appliance) RecomputeNow() {
	a.adm.Recompute(a.now(), a.engine)
	a.engine.Sweep() // the flow table drains after a flood with no packet passing
	if a.clu != nil {
		a.clu.Recomputed() // publish the new rates, read the others' (never blocks)
	}
	a.drainEvents()
	if a.opts.Access != nil {
		a.opts.Access.Flush() // lines reach the file within a recompute interval
	}
}

// every calls step each period of the running config until Close, following
// a reload that changes the period. It runs in its own goroutine.
func (a *Appliance) every(period func(*policy.Config) time.Duration, step func()) {
	defer a.wg.Done()
	p := period(a.cfg.Load())
	t := time.NewTicker(p)
	defer t.Stop()
	for {
		select {
		case <-a.stop:
			return
		case <-t.C:
		}
		if np := period(a.cfg.Load()); np != p {
			p = np
			t.Reset(p)
		}
		step()
	}
}

// drainEvents writes the admission's limit crossings to the log
// (obs.LimitEvent).
func (a *Appliance) drainEvents() {
	ev := a.adm.Events()
	for {
		select {
		case e := <-ev:
			obs.LimitEvent(&a.log, e)
		default:
			return
		}
	}
}

// sampleLoop runs in its own goroutine: every SamplingInterval it turns the
// connections' TCP measurements into weight fractions and new balancer
// weights, and writes one STATS line per target.
func (a *Appliance) sampleLoop() {
	a.every(func(c *policy.Config) time.Duration { return c.Monitor.SamplingInterval }, func() { a.SampleNow(); a.record() })
}

// SampleNow runs one sampling step at once: the loop calls it every
// SamplingInterval; the demo and tests call it to see a result without
// waiting.
func (a *Appliance) SampleNow() []policy.Explanation {
	cfg := a.cfg.Load()
	s := a.px.Sample()
	lost := a.host.Lost()
	if lost > 0 {
		a.log.Warn().Uint64("dropped", lost).Msg("host capture lost packets in the last interval (its socket buffer overran): the via: host legs' counts are partial")
	}
	samples := samplesFrom(cfg, s, a.OpenByTarget(), lost > 0)
	for k, r := range a.admit.TakeResponses() {
		if ts := samples[k]; ts != nil { // nil: a target gone in a reload
			ts.Responses, ts.ServerErrors, ts.FailedRequests = r.Responses, r.ServerErrors, r.Failed
		}
	}
	judged := samples
	if a.clu != nil {
		judged = a.shareSamples(cfg, samples) // the cluster-wide sums
	}
	a.explMu.Lock()
	expl := a.sampler.Sample(cfg, judged, a.expl[:0:0])
	a.expl, a.explAt = expl, a.now()
	a.explMu.Unlock()
	a.segs.Add(cfg, samples, a.host.Status(cfg))

	a.applyFractions(cfg, expl)
	a.logStats(expl)
	a.warnSkipped()
	return expl
}

// applyFractions hands each balancer the fractions of every service level
// of its targets (policy.ServiceFractions) and keeps the action levels' for
// /status and the STATS lines.
func (a *Appliance) applyFractions(cfg *policy.Config, expl []policy.Explanation) {
	by := policy.ServiceFractions(cfg, expl)
	actionFr := make(map[string]map[string]map[string]int, len(by))
	for name, l := range by {
		if len(l.ByAction) > 0 {
			actionFr[name] = l.ByAction
		}
	}
	a.explMu.Lock()
	a.actionFr = actionFr
	a.explMu.Unlock()
	for name, l := range by {
		if b := a.balancer(name); b != nil {
			b.SetFractions(l.Default, l.ByAction)
		}
	}
}

// monitorOff runs after a reload: a configuration with the monitor
// disabled puts every balancer back on its configured weights now, instead
// of leaving the last cut weights in place for good (no sample will cut
// them again, and none would restore them before the next interval).
func (a *Appliance) monitorOff(cfg *policy.Config) {
	if !cfg.Monitor.Enabled {
		a.applyFractions(cfg, nil)
	}
}

// warnSkipped writes the WebSphere plug-in's warning for each target
// passed over at its maxConnections since the last interval (obs.SkipLog).
func (a *Appliance) warnSkipped() {
	now := a.now()
	for name, b := range *a.bals.Load() {
		a.skips.Log(&a.log, name, b.Snapshot(now).Targets)
	}
}

// OpenByTarget counts the admitted connections per service and target now.
func (a *Appliance) OpenByTarget() map[policy.TargetKey]int64 {
	out := map[policy.TargetKey]int64{}
	for _, name := range sortedNames(*a.bals.Load()) {
		st := a.balancer(name).Snapshot(a.now())
		for _, t := range st.Targets {
			out[policy.TargetKey{Service: name, Target: t.Name}] = t.Open
		}
	}
	return out
}

// samplesFrom maps the forwarder's per-target aggregation onto the policy
// engine's samples. The per-direction data segments come from the
// connections the monitor's scope covers (ScopePolicy: those under a policy
// action, i.e. the TargetActions aggregates; ScopeAll: all), and
// policy.SelectDirection puts the direction the monitor reads into the
// ratios' inputs.
//
// captureLost says the host-leg capture lost packets during the interval:
// the directions it counted are then partial, not measured.
func samplesFrom(cfg *policy.Config, s proxy.Sample, open map[policy.TargetKey]int64, captureLost bool) map[policy.TargetKey]*policy.TargetSample {
	interval := s.End.Sub(s.Start)
	out := map[policy.TargetKey]*policy.TargetSample{}
	for _, vs := range cfg.Services {
		for _, t := range vs.Targets {
			k := policy.TargetKey{Service: vs.Name, Target: t.Name}
			out[k] = &policy.TargetSample{Interval: interval, ActiveConns: open[k]}
		}
	}
	all := cfg.Monitor.Scope == policy.ScopeAll
	for _, ag := range s.Targets {
		ts := out[policy.TargetKey{Service: ag.Service, Target: ag.Name}]
		if ts == nil {
			continue // a target gone in a reload
		}
		ts.Bytes += ag.Bytes
		if all {
			addDir(&ts.FromTarget, ag.FromTarget, captureLost)
			addDir(&ts.ToTarget, ag.ToTarget, captureLost)
		}
		ts.TimeoutsUnknown = ts.TimeoutsUnknown || ag.TimeoutsUnknown > 0
	}
	actions := map[string]*policy.Action{}
	for _, ac := range cfg.Actions {
		actions[ac.Name] = ac
	}
	for _, ag := range s.TargetActions {
		ts := out[policy.TargetKey{Service: ag.Service, Target: ag.Name}]
		if ts == nil {
			continue
		}
		if !all {
			addDir(&ts.FromTarget, ag.FromTarget, captureLost)
			addDir(&ts.ToTarget, ag.ToTarget, captureLost)
		}
		if act := actions[ag.Action]; act != nil {
			ts.Actions = append(ts.Actions, policy.ActionSample{Action: act, ActiveConns: int64(ag.Active), Bytes: ag.Bytes,
				WaitingConns: int64(ag.Waiting), WaitingBytes: ag.WaitingBytes, WaitingTime: ag.WaitingTime, OpenTime: ag.OpenTime})
		}
	}
	for _, ts := range out {
		policy.SelectDirection(&cfg.Monitor, ts)
	}
	return out
}

// addDir adds one aggregate's direction to a sample's.
func addDir(d *policy.DirSample, c proxy.DirCounters, captureLost bool) {
	d.DataSegments += c.DataSegments
	d.Retransmitted += c.Retransmitted
	d.Timeouts += c.Timeouts
	d.OutOfOrder += c.OutOfOrder
	d.IPIDPackets += c.IPIDPackets
	switch c.Source {
	case proxy.DirPassive, proxy.DirKernel:
		d.Measured = true
	case proxy.DirCapture:
		if captureLost {
			d.Partial = true
		} else {
			d.Measured = true
		}
	case proxy.DirEstimate:
		d.Estimate = true
	}
}

// logStats writes one STATS line per target (obs.Stats).
func (a *Appliance) logStats(expl []policy.Explanation) {
	a.explMu.Lock()
	actionFr := a.actionFr
	a.explMu.Unlock()
	for i := range expl {
		e := &expl[i]
		sg, _ := a.segs.Of(policy.TargetKey{Service: e.Service, Target: e.Target})
		obs.Stats(&a.log, e, sg, actionFr[e.Service], a.admit.Pending(e.Service, e.Target))
	}
}

// Explanation returns the last sampling interval's weight explanation of a
// target.
func (a *Appliance) Explanation(k policy.TargetKey) (policy.Explanation, bool) {
	a.explMu.Lock()
	defer a.explMu.Unlock()
	for _, e := range a.expl {
		if e.Service == k.Service && e.Target == k.Target {
			return e, true
		}
	}
	return policy.Explanation{}, false
}
