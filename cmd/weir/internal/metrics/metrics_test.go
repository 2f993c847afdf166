package metrics

import (
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"weir/cmd/weir/api"
)

// notMetrics are the numeric facts of api.Status that are deliberately not
// exported, each with the metric that already carries it (one metric per
// fact) or why it is no metric.
var notMetrics = map[string]string{
	"Services.Targets.Segments.FromTarget.OutOfOrder": "diagnostic, shown by /status and weir status",
	"Services.Targets.Segments.ToTarget.OutOfOrder":   "diagnostic, shown by /status and weir status",
	"Generation":                                "a configuration's identity, not a quantity; weir_reloads_total counts swaps",
	"DialFailures":                              "the sum of weir_target_connect_failures_total",
	"Services.Refused":                          "weir_refusals_total{level=balancer,limit=targets}",
	"Services.Targets.SlowStart":                "already in weir_target_weight{kind=effective}",
	"Services.Targets.Exact":                    "the unrounded effective weight: weir_target_weight{kind=effective} and weir_target_fraction_percent give it",
	"Services.Targets.Actions.Effective":        "weir_target_action_weight rounded down, shown by weir status",
	"Levels.EnforceConnections":                 "configuration, shown by weir status",
	"Levels.EnforceBandwidth":                   "configuration, shown by weir status",
	"Services.Targets.Down":                     "weir_target_up",
	"Services.Targets.HealthUp":                 "weir_target_up",
	"Draining":                                  "/healthz answers 503 while draining",
	"Cluster.Levels.Open":                       "weir_level_connections and weir_target_connections_open give the open connections here",
	"Cluster.Bandwidth.Max":                     "weir_level_max_bandwidth_bytes_per_second",
	"HTTP.Durations.Bounds":                     "the histogram's le labels",
	"Forwarder.HTTPClients":                     "the sum of weir_http_client_connections{kind=open}",
	"Levels.Queue.TimeoutMs":                    "configuration, shown by weir status",
	"Clients.Queue.TimeoutMs":                   "configuration, shown by weir status",
	"Clients.MaxConnections":                    "configuration, shown by weir status",
	"Clients.MaxBandwidth":                      "configuration, shown by weir status",
	"Clients.PrefixV4":                          "configuration, shown by weir status",
	"Clients.PrefixV6":                          "configuration, shown by weir status",
	"Clients.EnforceConnections":                "configuration, shown by weir status",
	"Clients.EnforceBandwidth":                  "configuration, shown by weir status",
	"Services.Targets.Replies.Interval.Replies": "the count behind weir_target_reply_latency_seconds; weir_target_replies_total counts every reply",
	"Services.Targets.Replies.Total.P50":        "since start, shown by /status and weir status; the interval's is weir_target_reply_latency_seconds",
	"Services.Targets.Replies.Total.P99":        "since start, shown by /status and weir status; the interval's is weir_target_reply_latency_seconds",
}

// explained is the part of a target's weight explanation that is exported
// (weir_target_fraction_percent); its other fields are the inputs and steps
// of that result, shown by weir status.
var explained = map[string]bool{
	"LossFraction": true, "TimeoutFraction": true, "DefaultFraction": true, "ActionFraction": true, "Fraction": true,
}

// populated returns a status document in which every numeric field has its
// own value (1001, 1002, …), and the values by field path.
func populated(t *testing.T) (api.Status, map[string][]float64) {
	t.Helper()
	st := api.Status{
		Levels:   []api.Level{{Level: "instance", Name: "i"}, {Level: "class", Name: "c", Queue: &api.Queue{Limit: 8}}},
		Clients:  []api.ClientTable{{Scope: "web", Queue: &api.Queue{Limit: 2}}},
		Services: []api.Service{{Name: "web", Proto: "http", Targets: []api.Target{{Name: "a", HealthUp: true}, {Name: "b", Down: true}}}},
		Refusals: []api.Refusal{{Level: "class", Limit: "maxConnections"}, {Level: "instance", Limit: "draining"}},
		Datapath: api.Datapath{Dropped: []api.Drop{{Reason: "truncated"}, {Reason: "bad_ihl"}}},
		NICs: []api.NIC{
			{Name: "front", Dropped: []api.Drop{{Reason: "queue_full"}}, Errors: []api.Drop{{Reason: "read"}}, Device: &api.Device{}},
			{Name: "back0", Dropped: []api.Drop{{Reason: "too_big"}}, Errors: []api.Drop{{Reason: "write"}}},
		},
	}
	st.Services[0].Targets[0].Explanation = &api.Explanation{}
	st.Services[0].Targets[0].Actions = []api.ActionLevel{{Action: "gold"}, {Action: "silver"}}
	st.Services[0].Targets[0].Segments = &api.Segments{}
	st.Services[0].Targets[0].Replies = &api.ReplyLatency{}
	st.TUN = &api.TUN{Name: "weir0"}
	st.Forwarder.ListenDropped = []api.Drop{{Reason: "segment_queue"}, {Reason: "accept_queue"}}
	st.Forwarder.SNIRefused = []api.Drop{{Reason: "malformed"}, {Reason: "no-match"}}
	st.Forwarder.ProxyRefused = []api.Drop{{Reason: "untrusted"}, {Reason: "malformed"}}
	st.Cluster = &api.Cluster{Members: []api.ClusterMember{{ID: "a"}},
		Levels:    []api.ClusterLevel{{Level: "virtual server", Name: "web"}, {Level: "target", Name: "a", Service: "web"}},
		Bandwidth: []api.ClusterBandwidth{{Level: "instance", Name: "i"}},
		Logged:    []api.ClusterLogged{{Level: "class", Name: "c"}}}
	st.HTTP = api.HTTP{
		Requests:  []api.RequestCount{{Service: "web", Target: "a", Code: "200"}, {Service: "web", Code: "503"}},
		InFlight:  []api.RequestsInFlight{{Service: "web", Target: "a"}},
		Durations: []api.RequestDurations{{Service: "web", Bounds: make([]float64, 2), Cumulative: make([]uint64, 2)}},
	}
	values := map[string][]float64{}
	next := 1000.0
	var fill func(path string, v reflect.Value)
	fill = func(path string, v reflect.Value) {
		switch v.Kind() {
		case reflect.Struct:
			if v.Type() == reflect.TypeOf(time.Time{}) {
				return
			}
			for i := 0; i < v.NumField(); i++ {
				name := v.Type().Field(i).Name
				if path != "" {
					name = path + "." + name
				}
				fill(name, v.Field(i))
			}
		case reflect.Slice:
			for i := 0; i < v.Len(); i++ {
				fill(path, v.Index(i))
			}
		case reflect.Pointer:
			if !v.IsNil() {
				fill(path, v.Elem())
			}
		case reflect.Int, reflect.Int64, reflect.Uint64, reflect.Float64:
			if v.Type() == reflect.TypeOf(time.Duration(0)) {
				return
			}
			next++
			switch v.Kind() {
			case reflect.Uint64:
				v.SetUint(uint64(next))
			case reflect.Float64:
				v.SetFloat(next)
			default:
				v.SetInt(int64(next))
			}
			values[path] = append(values[path], next)
		case reflect.Bool:
			values[path] = append(values[path], 0)
		}
	}
	fill("", reflect.ValueOf(&st).Elem())
	return st, values
}

func gather(t *testing.T, st api.Status) map[string]*dto.MetricFamily {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(NewCollector(func() api.Status { return st })); err != nil {
		t.Fatal(err)
	}
	fams, err := reg.Gather() // checks every sample against its described Desc
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*dto.MetricFamily{}
	for _, f := range fams {
		out[f.GetName()] = f
	}
	return out
}

func value(m *dto.Metric) float64 {
	if c := m.GetCounter(); c != nil {
		return c.GetValue()
	}
	return m.GetGauge().GetValue()
}

// numbers returns every number a sample carries: its value, or a
// histogram's count, sum and bucket counts.
func numbers(m *dto.Metric) []float64 {
	h := m.GetHistogram()
	if h == nil {
		return []float64{value(m)}
	}
	out := []float64{float64(h.GetSampleCount()), h.GetSampleSum()}
	for _, b := range h.Bucket {
		out = append(out, float64(b.GetCumulativeCount()))
	}
	return out
}

// TestEveryFactIsExported fails when a numeric fact of the status document
// (a new drop counter, say) has no metric and no entry in notMetrics, and
// when a metric family yields no sample from a full document.
func TestEveryFactIsExported(t *testing.T) {
	st, values := populated(t)
	fams := gather(t, st)
	exported := map[float64]bool{}
	for _, f := range fams {
		for _, m := range f.Metric {
			for _, v := range numbers(m) {
				exported[v] = true
			}
		}
	}
	for _, d := range Defs {
		if f := fams[d.Name]; f == nil || len(f.Metric) == 0 {
			t.Errorf("%s: no sample from a full status document", d.Name)
		}
	}
	for path, vs := range values {
		if _, ok := notMetrics[path]; ok {
			continue
		}
		if f, ok := strings.CutPrefix(path, "Services.Targets.Explanation."); ok && !explained[f] {
			continue
		}
		if vs[0] == 0 { // a bool: exported as a 0/1 gauge (weir_level_over) or in notMetrics
			continue
		}
		for _, v := range vs {
			if strings.HasSuffix(path, "Replies.Interval.P50") || strings.HasSuffix(path, "Replies.Interval.P99") {
				v /= 1e3 // milliseconds in /status, seconds in the metric
			}
			if !exported[v] {
				t.Errorf("status field %s (value %v) is exported by no metric: add one to Defs or say in notMetrics why not", path, v)
			}
		}
	}
}

// TestSamples pins where the labelled samples come from.
func TestSamples(t *testing.T) {
	st, _ := populated(t)
	fams := gather(t, st)
	find := func(name string, labels map[string]string) (float64, bool) {
		f := fams[name]
		if f == nil {
			return 0, false
		}
	next:
		for _, m := range f.Metric {
			if len(m.Label) != len(labels) {
				continue
			}
			for _, l := range m.Label {
				if labels[l.GetName()] != l.GetValue() {
					continue next
				}
			}
			return value(m), true
		}
		return 0, false
	}
	tg := st.Services[0].Targets
	for _, tc := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"weir_connections_open", nil, float64(st.Open)},
		{"weir_connections_pending", nil, float64(st.Forwarder.Pending)},
		{"weir_connections_accepted_total", nil, float64(st.Forwarder.Accepted)},
		{"weir_connections_closed_total", nil, float64(st.Closed)},
		{"weir_refusals_total", map[string]string{"level": "instance", "limit": "draining"}, float64(st.Refusals[1].Count)},
		{"weir_level_connections", map[string]string{"level": "class", "name": "c"}, float64(st.Levels[1].Connections)},
		{"weir_level_max_bandwidth_bytes_per_second", map[string]string{"level": "instance", "name": "i"}, float64(st.Levels[0].MaxBandwidth)},
		{"weir_level_over", map[string]string{"level": "instance", "name": "i"}, 0},
		{"weir_target_weight", map[string]string{"service": "web", "target": "b", "kind": "effective"}, float64(tg[1].Effective)},
		{"weir_target_weight", map[string]string{"service": "web", "target": "b", "kind": "base"}, float64(tg[1].Weight)},
		{"weir_target_fraction_percent", map[string]string{"service": "web", "target": "a", "part": "timeout"}, float64(tg[0].Explanation.TimeoutFraction)},
		{"weir_target_action_weight", map[string]string{"service": "web", "target": "a", "action": "silver"}, tg[0].Actions[1].Exact},
		{"weir_target_action_fraction_percent", map[string]string{"service": "web", "target": "a", "action": "gold"}, float64(tg[0].Actions[0].Fraction)},
		{"weir_target_up", map[string]string{"service": "web", "target": "a"}, 1},
		{"weir_target_up", map[string]string{"service": "web", "target": "b"}, 0},
		{"weir_target_connect_failures_total", map[string]string{"service": "web", "target": "b"}, float64(tg[1].Failed)},
		{"weir_datapath_dropped_total", map[string]string{"reason": "bad_ihl"}, float64(st.Datapath.Dropped[1].Count)},
		{"weir_datapath_flows_refused_total", nil, float64(st.Datapath.Flows.Refused)},
		{"weir_stack_syns_dropped_total", nil, float64(st.Stack.SYNsDroppedInFlight)},
		{"weir_nic_dropped_total", map[string]string{"nic": "front", "reason": "queue_full"}, float64(st.NICs[0].Dropped[0].Count)},
		{"weir_nic_errors_total", map[string]string{"nic": "back0", "op": "write"}, float64(st.NICs[1].Errors[0].Count)},
		{"weir_nic_packets_total", map[string]string{"nic": "back0", "direction": "tx"}, float64(st.NICs[1].TxPackets)},
		{"weir_transport_dropped_total", map[string]string{"nic": "front", "reason": "queue_full"}, float64(st.NICs[0].Device.DroppedFull)},
		{"weir_log_lines_dropped_total", nil, float64(st.Control.DroppedLogLines)},
		{"weir_transport_dropped_total", map[string]string{"nic": "front", "reason": "write_refused"}, float64(st.NICs[0].Device.WriteErrors)},
		{"weir_tun_kernel_dropped_total", map[string]string{"tun": "weir0", "direction": "to_weir"}, float64(st.TUN.ToWeirDropped)},
		{"weir_tun_kernel_errors_total", map[string]string{"tun": "weir0", "direction": "from_weir"}, float64(st.TUN.FromWeirErrors)},
		{"weir_admission_events_dropped_total", nil, float64(st.Control.DroppedEvents)},
	} {
		got, ok := find(tc.name, tc.labels)
		if !ok || got != tc.want {
			t.Errorf("%s%v = %v (found %v), want %v", tc.name, tc.labels, got, ok, tc.want)
		}
	}
	if _, ok := find("weir_transport_dropped_total", map[string]string{"nic": "back0", "reason": "queue_full"}); ok {
		t.Error("weir_transport_dropped_total for a transport that keeps no counters")
	}
}

// TestDefsAreWellFormed checks the table's own rules: one name per fact,
// Prometheus naming (counters end in _total, gauges do not), help an
// operator can read (no pointers into Go code).
func TestDefsAreWellFormed(t *testing.T) {
	name := regexp.MustCompile(`^weir_[a-z0-9]+(_[a-z0-9]+)*$`)
	seen := map[string]bool{}
	for _, d := range Defs {
		if seen[d.Name] {
			t.Errorf("%s defined twice", d.Name)
		}
		seen[d.Name] = true
		if !name.MatchString(d.Name) {
			t.Errorf("%s: not weir_<subsystem>_<what> in snake case", d.Name)
		}
		if (d.Type == Counter) != strings.HasSuffix(d.Name, "_total") {
			t.Errorf("%s: a %s; counters and only counters end in _total", d.Name, d.Type)
		}
		if len(d.Help) < 20 || strings.Contains(d.Help, "See netstack") || strings.Contains(d.Help, "Stats.") {
			t.Errorf("%s: help %q does not say what it counts", d.Name, d.Help)
		}
		for _, l := range d.Labels {
			if !regexp.MustCompile(`^[a-z]+$`).MatchString(l) {
				t.Errorf("%s: label %q", d.Name, l)
			}
		}
		if (d.samples == nil) != (d.Type == Histogram) || (d.histograms == nil) != (d.Type != Histogram) {
			t.Errorf("%s: no samples, or samples of the wrong kind", d.Name)
		}
	}
}

// TestEmptyStatus scrapes a document with no levels, services or NICs (the
// admin API before the appliance starts): no panic, only unlabelled samples.
func TestEmptyStatus(t *testing.T) {
	for name, f := range gather(t, api.Status{}) {
		for _, m := range f.Metric {
			if len(m.Label) != 0 {
				t.Errorf("%s: labelled sample %v from an empty document", name, m.Label)
			}
		}
	}
}
