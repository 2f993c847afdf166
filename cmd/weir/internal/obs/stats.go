package obs

import (
	"fmt"
	"sort"
	"sync"

	"github.com/rs/zerolog"

	"weir/balancer"
	"weir/cmd/weir/api"
	"weir/policy"
)

// Stats writes a target's STATS line, as the WebSphere plug-in does: the
// default level's explanation e, the target's segment counts sg, its
// pending requests, then each action level of its service with its
// fraction and weight there, from the service's action fractions fr
// (action → target → percent; the line's actions field,
// "levels=gold:100%->0" in its message).
func Stats(log *zerolog.Logger, e *policy.Explanation, sg api.Segments, fr map[string]map[string]int, pending int64) {
	levels, text := actionLevels(fr, e.Target, e.BaseWeight)
	log.Info().Str("service", e.Service).Str("target", e.Target).
		Str("direction", sg.Direction).
		Uint64("from_target_segs", sg.FromTarget.DataSegments).Uint64("from_target_retrans", sg.FromTarget.Retransmitted).
		Uint64("from_target_timeouts", sg.FromTarget.Timeouts).Str("from_target_source", sg.FromTarget.Source).Str("from_target_signal", sg.FromTarget.Signal).
		Uint64("to_target_segs", sg.ToTarget.DataSegments).Uint64("to_target_retrans", sg.ToTarget.Retransmitted).
		Uint64("to_target_timeouts", sg.ToTarget.Timeouts).Str("to_target_source", sg.ToTarget.Source).
		Int64("open", e.ActiveConns).Int64("max", e.MaxConns).
		Int64("pending_requests", pending).
		Int("loss_fr", e.LossFraction).Int("timeout_fr", e.TimeoutFraction).
		Uint64("responses", e.Responses).Uint64("server_errors", e.ServerErrors).Uint64("failed_requests", e.FailedRequests).
		Int("error_fr", e.ErrorFraction).
		Int("default_fr", e.DefaultFraction).Int("action_fr", e.ActionFraction).
		Int("fraction", e.Fraction).Str("winner", e.Winner.String()).
		Int("weight", e.BaseWeight).Int("effective", e.Weight).Int("default_effective", e.DefaultWeight).
		Dict("actions", levels).
		Msg("STATS " + e.String() + text)
}

// actionLevels is a target's action levels for its STATS line, from its
// service's action fractions fr (action → target → percent): a
// dictionary {action: {fraction, effective}} and the message's
// " levels=a:f%->w,…" (empty without action levels). A target missing from
// a level is at its base weight there (balancer.SetFractions).
func actionLevels(fr map[string]map[string]int, target string, base int) (*zerolog.Event, string) {
	d := zerolog.Dict()
	if len(fr) == 0 {
		return d, ""
	}
	names := make([]string, 0, len(fr))
	for name := range fr {
		names = append(names, name)
	}
	sort.Strings(names)
	b := []byte(" levels=")
	for i, name := range names {
		f := fr[name][target]
		w := policy.EffectiveWeight(base, f)
		d.Dict(name, zerolog.Dict().Int("fraction", f).Int("effective", w))
		if i > 0 {
			b = append(b, ',')
		}
		b = fmt.Appendf(b, "%s:%d%%->%d", name, f, w)
	}
	return d, string(b)
}

// LimitEvent writes a limit crossing of the admission: the Sun-style
// error-log line when a limit that is only logged is exceeded (warn), and
// the line saying it is back under (info).
func LimitEvent(log *zerolog.Logger, e policy.Event) {
	l := log.Warn()
	if !e.Over {
		l = log.Info()
	}
	l.Str("qos_level", e.Level.String()).Str("name", e.Name).Str("limit", e.Limit.String()).
		Int64("value", e.Value).Int64("measured", e.Measured).Bool("enforced", e.Enforced).
		Msg("qos: " + e.String())
}

// SkipLog writes the WebSphere plug-in's warning, once per call (a
// sampling interval) and target, for each target passed over at its
// maxConnections since the last call. Safe for concurrent use; the zero
// value is ready.
type SkipLog struct {
	mu   sync.Mutex
	seen map[policy.TargetKey]uint64 // SkippedAtLimit already warned about
}

// Log warns of the targets of service, from its balancer's snapshot, that
// were passed over at their limit since the last Log.
func (s *SkipLog) Log(log *zerolog.Logger, service string, targets []balancer.TargetStatus) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.seen == nil {
		s.seen = map[policy.TargetKey]uint64{}
	}
	for _, t := range targets {
		k := policy.TargetKey{Service: service, Target: t.Name}
		if d := t.SkippedAtLimit - s.seen[k]; t.SkippedAtLimit > s.seen[k] {
			log.Warn().Str("service", service).Str("target", t.Name).Uint64("skipped", d).
				Int64("open", t.Open).Int64("max", t.Max).
				Msg("target " + t.Name + " has reached maximum connections and is not selected")
		}
		s.seen[k] = t.SkippedAtLimit
	}
}
