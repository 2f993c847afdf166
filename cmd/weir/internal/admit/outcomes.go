package admit

import (
	"sync"

	"weir/netstack/proxy"
	"weir/policy"
)

// Outcomes of connections and requests at their targets, the inputs of the
// monitor's error fraction and of outlier ejection:
//
//	http request End ─► Served with a status: a response (5xx: a server error)
//	                 ─► TargetTimedOut, BadGateway: failed before a response
//	                 ─► the interval's counts per target (TakeResponses)
//	                 ─► the balancer's run of failures (ReportStatus, Report)
//	tcp End, Served  ─► a success for ejection (a failed dial or first-byte
//	                    timeout reported its failure through Lease.Failed)

// Responses are one target's http outcomes over a sampling interval.
type Responses struct {
	Responses    uint64 // requests the target answered, any status
	ServerErrors uint64 // of them with a 5xx status
	Failed       uint64 // requests that failed before a response
}

// outcomes counts Responses per target until TakeResponses.
type outcomes struct {
	mu sync.Mutex
	m  map[policy.TargetKey]*Responses // protected by mu
}

func (o *outcomes) add(k policy.TargetKey, status int, failed bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.m == nil {
		o.m = map[policy.TargetKey]*Responses{}
	}
	r := o.m[k]
	if r == nil {
		r = &Responses{}
		o.m[k] = r
	}
	switch {
	case failed:
		r.Failed++
	default:
		r.Responses++
		if status >= 500 && status <= 599 {
			r.ServerErrors++
		}
	}
}

// TakeResponses returns each target's http outcomes since the last call and
// starts counting afresh: the sampling loop calls it once an interval.
func (a *Admitter) TakeResponses() map[policy.TargetKey]Responses {
	o := &a.outcomes
	o.mu.Lock()
	defer o.mu.Unlock()
	out := make(map[policy.TargetKey]Responses, len(o.m))
	for k, r := range o.m {
		out[k] = *r
	}
	clear(o.m)
	return out
}

// requestOutcome counts an http request's end at its target and reports it
// to the balancer for ejection. Refusals and requests the client cut short
// are neither.
func (a *Admitter) requestOutcome(s *session, e *proxy.End, target string) {
	if target == "" || e.Decision.Verdict != proxy.Accept {
		return
	}
	vs := s.req.Service.Name
	k := policy.TargetKey{Service: vs, Target: target}
	b := a.balancer(vs)
	switch e.Outcome {
	case proxy.Served:
		if e.Request.Status == 0 {
			return
		}
		a.outcomes.add(k, e.Request.Status, false)
		if b != nil {
			b.ReportStatus(target, e.Request.Status, a.now())
		}
	case proxy.TargetTimedOut:
		a.outcomes.add(k, 0, true) // TargetFailed reported it to the balancer
	case proxy.BadGateway:
		a.outcomes.add(k, 0, true)
		if b != nil {
			b.Report(target, false, a.now())
		}
	}
}

// connOutcome reports a spliced tcp connection that was served as a
// success for ejection: its dial worked and its target answered in time.
func (a *Admitter) connOutcome(s *session, e *proxy.End) {
	if e.Outcome != proxy.Served || e.Decision.Verdict != proxy.Accept || e.Stats.Target == "" {
		return
	}
	if b := a.balancer(s.req.Service.Name); b != nil {
		b.Report(e.Stats.Target, true, a.now())
	}
}
