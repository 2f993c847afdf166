package appliance

import (
	"reflect"
	"strings"
	"unicode"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"weir/datapath"
	"weir/netstack"
)

// collector exports the appliance's state at scrape time: nothing on the
// datapath or the admission path touches Prometheus.
type collector struct{ a *Appliance }

// metricDef describes one metric the collector exports; the README's
// metrics table is generated from these (MetricsDoc).
type metricDef struct {
	name, help string
	counter    bool
	labels     []string
}

func (d metricDef) desc() *prometheus.Desc {
	return prometheus.NewDesc(d.name, d.help, d.labels, nil)
}

var (
	descOpenDef       = metricDef{"weir_connections_open", "Admitted connections not yet closed.", false, nil}
	descClosedDef     = metricDef{"weir_connections_closed_total", "Admitted connections that ended.", true, nil}
	descRefusalsDef   = metricDef{"weir_refusals_total", "Connections refused, by the level and limit that refused them.", true, []string{"level", "limit"}}
	descDialFailDef   = metricDef{"weir_dial_failures_total", "Connects to targets that failed.", true, nil}
	descReloadsDef    = metricDef{"weir_reloads_total", "Configurations swapped in.", true, nil}
	descReloadFailDef = metricDef{"weir_reload_failures_total", "Configurations rejected.", true, nil}
	descLevelConnsDef = metricDef{"weir_level_connections", "Open connections per QoS level.", false, []string{"level", "name"}}
	descLevelBWDef    = metricDef{"weir_level_bandwidth_bytes_per_second", "Bandwidth over the metric interval per QoS level.", false, []string{"level", "name"}}
	descLevelMaxBWDef = metricDef{"weir_level_max_bandwidth_bytes_per_second", "Configured maxBandwidth per QoS level (absent when unset).", false, []string{"level", "name"}}
	descLevelMaxCDef  = metricDef{"weir_level_max_connections", "Configured maxConnections per QoS level (absent when unset).", false, []string{"level", "name"}}
	descTOpenDef      = metricDef{"weir_target_connections_open", "Open connections per target.", false, []string{"service", "target"}}
	descTMaxDef       = metricDef{"weir_target_max_connections", "Target maxConnections (absent when unlimited).", false, []string{"service", "target"}}
	descTWeightDef    = metricDef{"weir_target_weight", "Target weight: the configured WLM weight (kind=base) and the weight after the QoS fraction (kind=effective).", false, []string{"service", "target", "kind"}}
	descTFractionDef  = metricDef{"weir_target_fraction_percent", "Target QoS weight fraction and its parts, in percent.", false, []string{"service", "target", "part"}}
	descTUpDef        = metricDef{"weir_target_up", "1 while the target may be picked (not down after a failed connect, health checks passing).", false, []string{"service", "target"}}
	descTPickedDef    = metricDef{"weir_target_picked_total", "Connections given to the target.", true, []string{"service", "target"}}
	descTFailedDef    = metricDef{"weir_target_connect_failures_total", "Connects to the target that failed.", true, []string{"service", "target"}}
	descTSkippedDef   = metricDef{"weir_target_skipped_at_limit_total", "Picks that passed the target over at maxConnections.", true, []string{"service", "target"}}
	descDroppedDef    = metricDef{"weir_datapath_dropped_total", "Packets from clients dropped before the stack, by reason.", true, []string{"reason"}}
	descNoTargetDef   = metricDef{"weir_service_no_target_total", "Connections refused because no target could serve.", true, []string{"service"}}
	descTSegsDef      = metricDef{"weir_target_data_segments_total", "Data segments (with payload; pure ACKs never count) on the target legs the monitor covers, by direction (from_target: the target's, to_target: weir's).", true, []string{"service", "target", "direction"}}
	descTRetransDef   = metricDef{"weir_target_retransmitted_segments_total", "Of those, retransmitted (for a via: host leg's from_target unknown: 0, see /status source).", true, []string{"service", "target", "direction"}}
	descTTimeoutsDef  = metricDef{"weir_target_timeouts_total", "Retransmission timeouts on the target legs the monitor covers, by direction.", true, []string{"service", "target", "direction"}}
)

var (
	descOpen       = descOpenDef.desc()
	descClosed     = descClosedDef.desc()
	descRefusals   = descRefusalsDef.desc()
	descDialFail   = descDialFailDef.desc()
	descReloads    = descReloadsDef.desc()
	descReloadFail = descReloadFailDef.desc()
	descLevelConns = descLevelConnsDef.desc()
	descLevelBW    = descLevelBWDef.desc()
	descLevelMaxBW = descLevelMaxBWDef.desc()
	descLevelMaxC  = descLevelMaxCDef.desc()
	descTOpen      = descTOpenDef.desc()
	descTMax       = descTMaxDef.desc()
	descTWeight    = descTWeightDef.desc()
	descTFraction  = descTFractionDef.desc()
	descTUp        = descTUpDef.desc()
	descTPicked    = descTPickedDef.desc()
	descTFailed    = descTFailedDef.desc()
	descTSkipped   = descTSkippedDef.desc()
	descDropped    = descDroppedDef.desc()
	descNoTarget   = descNoTargetDef.desc()
	descTSegs      = descTSegsDef.desc()
	descTRetrans   = descTRetransDef.desc()
	descTTimeouts  = descTTimeoutsDef.desc()
)

// metricDefs lists every fixed metric, in the README's order.
var metricDefs = []metricDef{
	descOpenDef,
	descClosedDef,
	descRefusalsDef,
	descDialFailDef,
	descReloadsDef,
	descReloadFailDef,
	descLevelConnsDef,
	descLevelBWDef,
	descLevelMaxBWDef,
	descLevelMaxCDef,
	descTOpenDef,
	descTMaxDef,
	descTWeightDef,
	descTFractionDef,
	descTUpDef,
	descTPickedDef,
	descTFailedDef,
	descTSkippedDef,
	descDroppedDef,
	descNoTargetDef,
	descTSegsDef,
	descTRetransDef,
	descTTimeoutsDef,
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	// Unchecked collector: the struct-derived counters are only known at
	// collect time.
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	a := c.a
	st := a.StatusDoc()
	gauge := func(d *prometheus.Desc, v float64, l ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, l...)
	}
	counter := func(d *prometheus.Desc, v float64, l ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, l...)
	}
	gauge(descOpen, float64(st.Open))
	counter(descClosed, float64(a.counters.closed.Load()))
	counter(descDialFail, float64(st.DialFailures))
	counter(descReloads, float64(a.counters.reloads.Load()))
	counter(descReloadFail, float64(a.counters.reloadFailures.Load()))
	for _, r := range st.Refusals {
		counter(descRefusals, float64(r.Count), r.Level, r.Limit)
	}
	for _, l := range st.Levels {
		gauge(descLevelConns, float64(l.Connections), l.Level, l.Name)
		gauge(descLevelBW, float64(l.Bandwidth), l.Level, l.Name)
		if l.MaxBandwidth > 0 {
			gauge(descLevelMaxBW, float64(l.MaxBandwidth), l.Level, l.Name)
		}
		if l.MaxConnections > 0 {
			gauge(descLevelMaxC, float64(l.MaxConnections), l.Level, l.Name)
		}
	}
	for _, s := range st.Services {
		counter(descNoTarget, float64(s.Refused), s.Name)
		for _, t := range s.Targets {
			gauge(descTOpen, float64(t.Open), s.Name, t.Name)
			if t.Max > 0 {
				gauge(descTMax, float64(t.Max), s.Name, t.Name)
			}
			gauge(descTWeight, float64(t.Weight), s.Name, t.Name, "base")
			gauge(descTWeight, float64(t.Effective), s.Name, t.Name, "effective")
			up := 1.0
			if t.Down || !t.HealthUp {
				up = 0
			}
			gauge(descTUp, up, s.Name, t.Name)
			counter(descTPicked, float64(t.Picked), s.Name, t.Name)
			counter(descTFailed, float64(t.Failed), s.Name, t.Name)
			counter(descTSkipped, float64(t.SkippedAtLimit), s.Name, t.Name)
			if sg := t.Segments; sg != nil {
				for _, d := range []struct {
					name string
					t    DirTotals
				}{{"from_target", sg.FromTarget}, {"to_target", sg.ToTarget}} {
					counter(descTSegs, float64(d.t.DataSegments), s.Name, t.Name, d.name)
					counter(descTRetrans, float64(d.t.Retransmitted), s.Name, t.Name, d.name)
					counter(descTTimeouts, float64(d.t.Timeouts), s.Name, t.Name, d.name)
				}
			}
			if e := t.Explanation; e != nil {
				gauge(descTFraction, float64(e.LossFraction), s.Name, t.Name, "loss")
				gauge(descTFraction, float64(e.TimeoutFraction), s.Name, t.Name, "timeout")
				gauge(descTFraction, float64(e.DefaultFraction), s.Name, t.Name, "default")
				gauge(descTFraction, float64(e.ActionFraction), s.Name, t.Name, "action")
				gauge(descTFraction, float64(e.Fraction), s.Name, t.Name, "total")
			}
		}
	}
	if ds, ok := st.Datapath.(datapath.EngineStats); ok {
		for i, n := range ds.Dropped {
			if r := datapath.DropReason(i); r != datapath.DropNone {
				counter(descDropped, float64(n), r.String())
			}
		}
	}
	structMetrics(ch, "weir_datapath", st.Datapath)
	structMetrics(ch, "weir_stack", st.Stack)
	structMetrics(ch, "weir_forwarder", st.Forwarder)
}

// structMetrics exports every unsigned integer field of a stats struct as a
// counter named <prefix>_<field in snake case>_total, and every signed one as
// a gauge: the subsystems' Stats structs are the single list of what they
// count, so a counter added there is exported without touching this file.
func structMetrics(ch chan<- prometheus.Metric, prefix string, s any) {
	v := reflect.ValueOf(s)
	for v.Kind() == reflect.Pointer || v.Kind() == reflect.Interface {
		if v.IsNil() {
			return
		}
		v = v.Elem()
	}
	if v.Kind() != reflect.Struct {
		return
	}
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		fv := v.Field(i)
		name := prefix + "_" + snake(f.Name)
		switch fv.Kind() {
		case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
			d := prometheus.NewDesc(name+"_total", "See "+t.String()+"."+f.Name+".", nil, nil)
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(fv.Uint()))
		case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
			d := prometheus.NewDesc(name, "See "+t.String()+"."+f.Name+".", nil, nil)
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(fv.Int()))
		case reflect.Struct:
			if f.Anonymous {
				structMetrics(ch, prefix, fv.Interface())
			}
		}
	}
}

// snake turns a Go field name into snake case: DroppedQueueFull →
// dropped_queue_full, TCPResetsSent → tcp_resets_sent.
func snake(s string) string {
	var b strings.Builder
	r := []rune(s)
	for i, c := range r {
		if unicode.IsUpper(c) {
			if i > 0 && (unicode.IsLower(r[i-1]) || (i+1 < len(r) && unicode.IsLower(r[i+1]) && unicode.IsUpper(r[i-1]))) {
				b.WriteByte('_')
			}
			b.WriteRune(unicode.ToLower(c))
		} else {
			b.WriteRune(c)
		}
	}
	return b.String()
}

// MetricDoc is one exported metric, for documentation.
type MetricDoc struct {
	Name, Type, Help string
	Labels           []string
}

// MetricsDoc lists every metric weir exports: the fixed ones, then the
// counters derived from the datapath, stack and forwarder stats structs. The
// README's table is generated from it and a test keeps the two equal.
func MetricsDoc() []MetricDoc {
	var out []MetricDoc
	for _, d := range metricDefs {
		typ := "gauge"
		if d.counter {
			typ = "counter"
		}
		out = append(out, MetricDoc{Name: d.name, Type: typ, Help: d.help, Labels: d.labels})
	}
	for _, s := range []struct {
		prefix string
		v      any
	}{
		{"weir_datapath", datapath.EngineStats{}},
		{"weir_stack", netstack.StackStats{}},
		{"weir_forwarder", netstack.ForwarderStats{}},
	} {
		ch := make(chan prometheus.Metric, 256)
		structMetrics(ch, s.prefix, s.v)
		close(ch)
		for m := range ch {
			var pb dto.Metric
			m.Write(&pb)
			typ := "gauge"
			if pb.Counter != nil {
				typ = "counter"
			}
			name, help := descNameHelp(m.Desc())
			out = append(out, MetricDoc{Name: name, Type: typ, Help: help})
		}
	}
	return out
}

// descNameHelp reads a Desc's name and help back from its String form
// (client_golang keeps them unexported).
func descNameHelp(d *prometheus.Desc) (name, help string) {
	s := d.String()
	field := func(key string) string {
		i := strings.Index(s, key+`: "`)
		if i < 0 {
			return ""
		}
		rest := s[i+len(key)+3:]
		if j := strings.Index(rest, `"`); j >= 0 {
			return rest[:j]
		}
		return ""
	}
	return field("fqName"), field("help")
}
