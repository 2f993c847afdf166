package cluster

import (
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"weir/policy"
)

// One view of target quality
//
// Every sampling interval each instance publishes its per-target samples
// (data segments, retransmissions, timeouts and out-of-order segments per
// direction, bytes, connections per service level, http responses and
// their 5xx) and the down-state of
// its targets (the end of a retry interval after a failed connect), and
// judges the z/OS fractions on the cluster-wide sums. The samples are
// filed by epoch of Redis's clock (floor(now / SamplingInterval)), and
// each instance reads the previous epoch, which every member has finished
// writing: all instances sum the same samples and, their Sampler fed the
// same inputs, give a target the same effective weight, and the same
// Maglev table. The price is one sampling interval of lag: loss that
// starts in one interval cuts the weight everywhere within two. A member
// whose sample misses its epoch (a stall of a whole interval) is left out
// of that epoch's sums. When Redis does not answer, the instance judges
// its own samples (SampleFallbacks counts it).

//go:embed samples.lua
var samplesSrc string

var samplesScript = redis.NewScript(samplesSrc)

// wireSample is one target's sample as published.
type wireSample struct {
	S, T string // service, target
	F, O wireDir
	B    uint64 `json:",omitempty"` // bytes
	C    int64  `json:",omitempty"` // active connections
	TU   bool   `json:",omitempty"` // timeouts unknown
	// RS, RE, RF are the http responses, those with a 5xx status and the
	// requests that failed before a response (the error fraction's inputs).
	RS, RE, RF uint64 `json:",omitempty"`
	A          []wireAction
	// D is the end of the target's retry interval after a failed connect
	// (Unix ms), 0 when it is up.
	D int64 `json:",omitempty"`
}

// wireDir is a DirSample: segments, retransmitted, timeouts, out of
// order, IP-ID packets, measured, estimate, partial (a host capture lost
// packets).
type wireDir struct {
	D, R, T, OO uint64 `json:",omitempty"`
	I           uint64 `json:",omitempty"` // IP-ID packets
	M, E, P     bool   `json:",omitempty"`
}

type wireAction struct {
	N     string // the action's name
	C, WC int64  `json:",omitempty"`
	B, WB uint64 `json:",omitempty"`
	WT    int64  `json:",omitempty"` // waiting time, ns
}

func toWire(d policy.DirSample) wireDir {
	return wireDir{D: d.DataSegments, R: d.Retransmitted, T: d.Timeouts, OO: d.OutOfOrder, I: d.IPIDPackets, M: d.Measured, E: d.Estimate, P: d.Partial}
}

func addWire(d *policy.DirSample, w wireDir) {
	d.DataSegments += w.D
	d.Retransmitted += w.R
	d.Timeouts += w.T
	d.OutOfOrder += w.OO
	d.IPIDPackets += w.I
	d.Measured = d.Measured || w.M
	d.Estimate = d.Estimate || w.E
	d.Partial = d.Partial || w.P
}

// Shared is the cluster-wide view of one sampling interval.
type Shared struct {
	// Samples are the sums over the members' samples of the previous
	// epoch, the direction selected as cfg's monitor reads it; the local
	// samples when Redis did not answer (OK false).
	Samples map[policy.TargetKey]*policy.TargetSample
	// Down holds, per target another member saw fail to connect, the end
	// of its retry interval.
	Down map[policy.TargetKey]time.Time
	// Members counts the members whose samples were summed.
	Members int
	OK      bool
}

// ShareSamples publishes this instance's samples of the interval that
// just ended (local, as the appliance built them) and the down-state of
// its targets (down: the end of each retry interval in progress), and
// returns the cluster-wide sums of the previous epoch. One round trip,
// bounded by half the sampling interval. Call it from the sampling loop.
func (c *Cluster) ShareSamples(ctx context.Context, cfg *policy.Config, local map[policy.TargetKey]*policy.TargetSample,
	down map[policy.TargetKey]time.Time) Shared {
	iv := cfg.Monitor.SamplingInterval
	out := make([]wireSample, 0, len(local))
	for _, k := range slices.SortedFunc(maps.Keys(local), func(a, b policy.TargetKey) int {
		if a.Service != b.Service {
			return strings.Compare(a.Service, b.Service)
		}
		return strings.Compare(a.Target, b.Target)
	}) {
		s := local[k]
		w := wireSample{S: k.Service, T: k.Target, F: toWire(s.FromTarget), O: toWire(s.ToTarget), B: s.Bytes, C: s.ActiveConns, TU: s.TimeoutsUnknown,
			RS: s.Responses, RE: s.ServerErrors, RF: s.FailedRequests}
		for _, a := range s.Actions {
			if a.Action == nil {
				continue
			}
			w.A = append(w.A, wireAction{N: a.Action.Name, C: a.ActiveConns, B: a.Bytes, WC: a.WaitingConns, WB: a.WaitingBytes, WT: int64(a.WaitingTime)})
		}
		if u, ok := down[k]; ok {
			w.D = u.UnixMilli()
		}
		out = append(out, w)
	}
	body, err := json.Marshal(out)
	if err != nil {
		return c.sampleFallback(local, err)
	}
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return Shared{Samples: local}
	}
	rctx, cancel := context.WithTimeout(ctx, max(min(iv/2, c.o.Config.LeaseInterval/2), 10*time.Millisecond))
	res, err := samplesScript.Run(rctx, c.rdb, []string{c.prefix + "samples:"}, c.o.Config.Instance, iv.Milliseconds(), body).Slice()
	cancel()
	c.sampleRounds.Add(1)
	if err != nil {
		return c.sampleFallback(local, err)
	}
	if len(res)%2 != 1 {
		return c.sampleFallback(local, fmt.Errorf("cluster: samples script answered %d values", len(res)))
	}
	actions := map[string]*policy.Action{}
	for _, a := range cfg.Actions {
		actions[a.Name] = a
	}
	sh := Shared{Samples: map[policy.TargetKey]*policy.TargetSample{}, Down: map[policy.TargetKey]time.Time{}, OK: true}
	for k, s := range local {
		// Every local target is judged, with the sums where the cluster
		// had samples of it, on nothing (a quiet interval) otherwise.
		sh.Samples[k] = &policy.TargetSample{Interval: s.Interval}
	}
	now := time.Now()
	for i := 1; i+1 < len(res); i += 2 {
		id, _ := res[i].(string)
		raw, _ := res[i+1].(string)
		var ws []wireSample
		if err := json.Unmarshal([]byte(raw), &ws); err != nil {
			c.sampleBad.Add(1) // a member of another version: left out
			continue
		}
		sh.Members++
		for _, w := range ws {
			k := policy.TargetKey{Service: w.S, Target: w.T}
			if w.D > 0 && id != c.o.Config.Instance {
				if u := time.UnixMilli(w.D); u.After(now) && u.After(sh.Down[k]) {
					sh.Down[k] = u
				}
			}
			s := sh.Samples[k]
			if s == nil {
				continue // not a target of this instance's config
			}
			addWire(&s.FromTarget, w.F)
			addWire(&s.ToTarget, w.O)
			s.Bytes += w.B
			s.ActiveConns += w.C
			s.TimeoutsUnknown = s.TimeoutsUnknown || w.TU
			s.Responses += w.RS
			s.ServerErrors += w.RE
			s.FailedRequests += w.RF
			for _, wa := range w.A {
				act := actions[wa.N]
				if act == nil {
					continue
				}
				j := slices.IndexFunc(s.Actions, func(a policy.ActionSample) bool { return a.Action.Name == wa.N })
				if j < 0 {
					s.Actions = append(s.Actions, policy.ActionSample{Action: act})
					j = len(s.Actions) - 1
				}
				as := &s.Actions[j]
				as.ActiveConns += wa.C
				as.Bytes += wa.B
				as.WaitingConns += wa.WC
				as.WaitingBytes += wa.WB
				as.WaitingTime += time.Duration(wa.WT)
			}
		}
	}
	if sh.Members == 0 {
		// The first interval: no epoch behind it yet.
		sh.Samples, sh.OK = local, false
		return sh
	}
	for _, s := range sh.Samples {
		policy.SelectDirection(&cfg.Monitor, s)
	}
	c.mu.Lock()
	c.sampleMembers, c.sampleErr = sh.Members, ""
	c.mu.Unlock()
	return sh
}

// sampleFallback counts a failed exchange and returns the local view.
func (c *Cluster) sampleFallback(local map[policy.TargetKey]*policy.TargetSample, err error) Shared {
	c.sampleFails.Add(1)
	c.mu.Lock()
	c.sampleErr = err.Error()
	c.mu.Unlock()
	return Shared{Samples: local}
}
