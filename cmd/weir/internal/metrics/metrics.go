// Package metrics exports weir's /status document to Prometheus. Every
// metric is written once, in Defs: its name, type, labels, help and the fact
// of api.Status it reads. The collector reads one status document per
// scrape, so /status, `weir status` and /metrics cannot disagree, and
// nothing on the datapath or the admission path touches Prometheus. The table
// of metrics in docs/operations.md is generated from Defs.
package metrics

//go:generate go run golang.org/x/tools/cmd/stringer@v0.52.0 -type=Type -linecomment -output=type_string.go
import (
	"github.com/prometheus/client_golang/prometheus"

	"weir/cmd/weir/api"
)

// Type is a metric's Prometheus type.
type Type uint8

// The metric types weir exports.
const (
	Gauge     Type = iota // gauge
	Counter               // counter
	Histogram             // histogram
)

// Def is one metric: what it is called and means, and where in the status
// document its samples come from.
type Def struct {
	Name   string
	Type   Type
	Labels []string
	// Help says what the metric counts and what an operator does when it
	// moves.
	Help string
	// samples emits the metric's samples from st, label values in Labels'
	// order.
	samples func(st *api.Status, emit func(v float64, labels ...string))
	// histograms emits a Histogram's samples instead: count, sum and the
	// cumulative count per upper bound.
	histograms func(st *api.Status, emit func(count uint64, sum float64, buckets map[float64]uint64, labels ...string))
}

// udpOn reports whether st has udp services (or had sessions): the udp
// metrics with labels are emitted only then.
func udpOn(st *api.Status) bool { return st.UDP.Endpoints > 0 || st.UDP.Created > 0 }

// emitter is the function a Def's samples calls per sample.
type emitter = func(v float64, labels ...string)

// hostCap reads a host-capture counter, 0 without one.
func hostCap(st *api.Status, f func(*api.HostCapture) uint64) float64 {
	if st.HostCapture == nil {
		return 0
	}
	return float64(f(st.HostCapture))
}

func one(f func(st *api.Status) float64) func(*api.Status, emitter) {
	return func(st *api.Status, emit emitter) { emit(f(st)) }
}

func perLevel(f func(l *api.Level) (float64, bool)) func(*api.Status, emitter) {
	return func(st *api.Status, emit emitter) {
		for i := range st.Levels {
			l := &st.Levels[i]
			if v, ok := f(l); ok {
				emit(v, l.Level, l.Name)
			}
		}
	}
}

// dirLabels label the per-direction target metrics.
var dirLabels = []string{"service", "target", "direction"}

// perDirection emits v of each target's from_target and to_target totals.
func perDirection(v func(*api.DirTotals) float64) func(*api.Status, emitter) {
	return perTarget(func(t *api.Target, emit func(float64, ...string)) {
		if sg := t.Segments; sg != nil {
			emit(v(&sg.FromTarget), "from_target")
			emit(v(&sg.ToTarget), "to_target")
		}
	})
}

func perTarget(f func(t *api.Target, emit func(v float64, extra ...string))) func(*api.Status, emitter) {
	return func(st *api.Status, emit emitter) {
		for _, s := range st.Services {
			for i := range s.Targets {
				t := &s.Targets[i]
				f(t, func(v float64, extra ...string) { emit(v, append([]string{s.Name, t.Name}, extra...)...) })
			}
		}
	}
}

func perNIC(f func(n *api.NIC, emit func(v float64, extra ...string))) func(*api.Status, emitter) {
	return func(st *api.Status, emit emitter) {
		for i := range st.NICs {
			n := &st.NICs[i]
			f(n, func(v float64, extra ...string) { emit(v, append([]string{n.Name}, extra...)...) })
		}
	}
}

func drops(d []api.Drop, emit func(v float64, extra ...string)) {
	for _, x := range d {
		emit(float64(x.Count), x.Reason)
	}
}

func perCluster(f func(c *api.Cluster, emit emitter)) func(*api.Status, emitter) {
	return func(st *api.Status, emit emitter) {
		if st.Cluster != nil {
			f(st.Cluster, emit)
		}
	}
}

func perClusterLevel(f func(l *api.ClusterLevel) float64) func(*api.Status, emitter) {
	return perCluster(func(c *api.Cluster, emit emitter) {
		for i := range c.Levels {
			l := &c.Levels[i]
			name := l.Name
			if l.Service != "" {
				name = l.Service + "/" + l.Name
			}
			emit(f(l), l.Level, name)
		}
	})
}

// perQueue emits f of every level's queue, then of every client table's.
func perQueue(f func(q *api.Queue) float64) func(*api.Status, emitter) {
	return func(st *api.Status, emit emitter) {
		for i := range st.Levels {
			if l := &st.Levels[i]; l.Queue != nil {
				emit(f(l.Queue), l.Level, l.Name)
			}
		}
		for i := range st.Clients {
			if c := &st.Clients[i]; c.Queue != nil {
				emit(f(c.Queue), "client", c.Scope)
			}
		}
	}
}

func perClientTable(f func(c *api.ClientTable) float64) func(*api.Status, emitter) {
	return func(st *api.Status, emit emitter) {
		for i := range st.Clients {
			emit(f(&st.Clients[i]), st.Clients[i].Scope)
		}
	}
}

func bool01(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

var (
	levelLabels  = []string{"level", "name"}
	targetLabels = []string{"service", "target"}
	actionLabels = []string{"service", "target", "action"}
)

// Defs is every metric weir exports, in the order of docs/operations.md's table.
var Defs = []Def{
	// Connections.
	{Name: "weir_connections_open", Type: Gauge,
		Help:    "Admitted connections not yet closed. Compare weir_level_connections with weir_level_max_connections to see which limit they approach.",
		samples: one(func(st *api.Status) float64 { return float64(st.Open) })},
	{Name: "weir_connections_pending", Type: Gauge,
		Help:    "Connections between the client's SYN and the splice to a target (admission, target connect, client handshake). A steady rise means targets answer slowly: see weir_target_connect_failures_total.",
		samples: one(func(st *api.Status) float64 { return float64(st.Forwarder.Pending) })},
	{Name: "weir_connections_accepted_total", Type: Counter,
		Help:    "Connections spliced to a target.",
		samples: one(func(st *api.Status) float64 { return float64(st.Forwarder.Accepted) })},
	{Name: "weir_connections_closed_total", Type: Counter,
		Help:    "Admitted connections that ended.",
		samples: one(func(st *api.Status) float64 { return float64(st.Closed) })},
	{Name: "weir_refusals_total", Type: Counter, Labels: []string{"level", "limit"},
		Help: "Connections refused, by the level and limit that refused them (level balancer, limit targets: no target could serve; limit draining: weir was draining). A rising maxConnections or maxBandwidth count means the limit is too low for the load or a client is flooding; targets means every target is down, unhealthy or full (see weir_target_up).",
		samples: func(st *api.Status, emit emitter) {
			for _, r := range st.Refusals {
				emit(float64(r.Count), r.Level, r.Limit)
			}
		}},
	{Name: "weir_reloads_total", Type: Counter,
		Help:    "Configurations swapped in after the first (SIGHUP or a changed file).",
		samples: one(func(st *api.Status) float64 { return float64(st.Reloads) })},
	{Name: "weir_reload_failures_total", Type: Counter,
		Help:    "Configurations rejected; the previous one kept running. weir status shows the last error.",
		samples: one(func(st *api.Status) float64 { return float64(st.ReloadFailures) })},

	// QoS levels.
	{Name: "weir_level_connections", Type: Gauge, Labels: levelLabels,
		Help:    "Connections (requests, for http services) counted against each QoS level now.",
		samples: perLevel(func(l *api.Level) (float64, bool) { return float64(l.Connections), true })},
	{Name: "weir_level_max_connections", Type: Gauge, Labels: levelLabels,
		Help:    "The level's configured maxConnections; absent when unset.",
		samples: perLevel(func(l *api.Level) (float64, bool) { return float64(l.MaxConnections), l.MaxConnections > 0 })},
	{Name: "weir_level_bandwidth_bytes_per_second", Type: Gauge, Labels: levelLabels,
		Help:    "Bytes of admitted connections over the metric interval, per second, per QoS level.",
		samples: perLevel(func(l *api.Level) (float64, bool) { return float64(l.Bandwidth), true })},
	{Name: "weir_level_max_bandwidth_bytes_per_second", Type: Gauge, Labels: levelLabels,
		Help:    "The level's configured maxBandwidth; absent when unset.",
		samples: perLevel(func(l *api.Level) (float64, bool) { return float64(l.MaxBandwidth), l.MaxBandwidth > 0 })},
	{Name: "weir_level_over", Type: Gauge, Labels: levelLabels,
		Help:    "1 while the level exceeds a limit (connections, bandwidth or burst): enforced limits refuse new connections, logged ones only warn.",
		samples: perLevel(func(l *api.Level) (float64, bool) { return bool01(l.Over), true })},

	// Queues at the connection limits (limits.queue, clientLimits.queue):
	// level "client" with the service's name ("" the instance) for a
	// client table's queues, summed over its clients.
	{Name: "weir_queue_waiting", Type: Gauge, Labels: levelLabels,
		Help:    "Connections (requests) waiting now in the level's queue for a slot at its maxConnections. Near the queue's limit: the next arrivals are refused at once (weir_queue_full_total).",
		samples: perQueue(func(q *api.Queue) float64 { return float64(q.Waiting) })},
	{Name: "weir_queue_limit", Type: Gauge, Labels: levelLabels,
		Help:    "The queue's configured length (queue); per client for a client table's queues.",
		samples: perQueue(func(q *api.Queue) float64 { return float64(q.Limit) })},
	{Name: "weir_queue_waits_total", Type: Counter, Labels: levelLabels,
		Help:    "Connections (requests) that joined the level's queue.",
		samples: perQueue(func(q *api.Queue) float64 { return float64(q.Waits) })},
	{Name: "weir_queue_served_total", Type: Counter, Labels: levelLabels,
		Help:    "Connections (requests) admitted from the level's queue.",
		samples: perQueue(func(q *api.Queue) float64 { return float64(q.Served) })},
	{Name: "weir_queue_timeouts_total", Type: Counter, Labels: levelLabels,
		Help:    "Connections (requests) refused after waiting queueTimeout in the level's queue: the limit is too low for the load, or its holders too slow.",
		samples: perQueue(func(q *api.Queue) float64 { return float64(q.TimedOut) })},
	{Name: "weir_queue_full_total", Type: Counter, Labels: levelLabels,
		Help:    "Connections (requests) refused at once because the level's queue was full.",
		samples: perQueue(func(q *api.Queue) float64 { return float64(q.Full) })},
	{Name: "weir_queue_wait_seconds_total", Type: Counter, Labels: levelLabels,
		Help:    "Time spent in the level's queue by the connections that left it; divided by weir_queue_waits_total, the mean wait.",
		samples: perQueue(func(q *api.Queue) float64 { return q.WaitedSec })},

	// Per-client limits (clientLimits).
	{Name: "weir_client_table_clients", Type: Gauge, Labels: []string{"service"},
		Help:    "Clients kept in the per-client table of the service (\"\" for the instance's), idle ones included; bounded by tableSize.",
		samples: perClientTable(func(c *api.ClientTable) float64 { return float64(c.Clients) })},
	{Name: "weir_client_table_size", Type: Gauge, Labels: []string{"service"},
		Help:    "The per-client table's bound (tableSize).",
		samples: perClientTable(func(c *api.ClientTable) float64 { return float64(c.Size) })},
	{Name: "weir_client_table_active", Type: Gauge, Labels: []string{"service"},
		Help:    "Clients with a connection (request) open or queued in the per-client table.",
		samples: perClientTable(func(c *api.ClientTable) float64 { return float64(c.Active) })},
	{Name: "weir_client_refused_total", Type: Counter, Labels: []string{"service"},
		Help:    "Connections (requests) refused at a per-client limit.",
		samples: perClientTable(func(c *api.ClientTable) float64 { return float64(c.Refused) })},
	{Name: "weir_client_table_overflow_total", Type: Counter, Labels: []string{"service"},
		Help:    "New clients admitted without a per-client limit because the table was full of active clients: raise tableSize.",
		samples: perClientTable(func(c *api.ClientTable) float64 { return float64(c.Overflow) })},
	{Name: "weir_client_table_evicted_total", Type: Counter, Labels: []string{"service"},
		Help:    "Idle clients dropped, least recently used first, to make room for new ones (their bandwidth history with them).",
		samples: perClientTable(func(c *api.ClientTable) float64 { return float64(c.Evicted) })},

	// Targets.
	{Name: "weir_target_connections_open", Type: Gauge, Labels: targetLabels,
		Help:    "Open connections to the target.",
		samples: perTarget(func(t *api.Target, emit func(float64, ...string)) { emit(float64(t.Open)) })},
	{Name: "weir_target_max_connections", Type: Gauge, Labels: targetLabels,
		Help: "The target's maxConnections; absent when unlimited.",
		samples: perTarget(func(t *api.Target, emit func(float64, ...string)) {
			if t.Max > 0 {
				emit(float64(t.Max))
			}
		})},
	{Name: "weir_target_weight", Type: Gauge, Labels: []string{"service", "target", "kind"},
		Help: "The target's configured WLM weight (kind=base) and its weight after the QoS fraction (kind=effective); effective well below base means weir measures loss, timeouts or pressure there.",
		samples: perTarget(func(t *api.Target, emit func(float64, ...string)) {
			emit(float64(t.Weight), "base")
			emit(float64(t.Effective), "effective")
		})},
	{Name: "weir_target_fraction_percent", Type: Gauge, Labels: []string{"service", "target", "part"},
		Help: "The target's QoS weight fraction (part=total) and its parts (loss, timeout, error, default, action) from the last sampling interval, in percent; the part equal to the total is the cause of a cut weight. part=error is an http target's 5xx ratio (monitor.errorRatioAndWeightFr).",
		samples: perTarget(func(t *api.Target, emit func(float64, ...string)) {
			if e := t.Explanation; e != nil {
				emit(float64(e.LossFraction), "loss")
				emit(float64(e.TimeoutFraction), "timeout")
				emit(float64(e.ErrorFraction), "error")
				emit(float64(e.DefaultFraction), "default")
				emit(float64(e.ActionFraction), "action")
				emit(float64(e.Fraction), "total")
			}
		})},
	{Name: "weir_target_action_weight", Type: Gauge, Labels: actionLabels,
		Help: "The weight the target's new connections classified to a policy action are balanced on, unrounded (weight 1 at 25 % is 0.75), per action with connections to the service in the last sampling interval; connections under no action (or another action) use weir_target_weight{kind=effective}. 0 while that service level is cut to 100 %: its new connections go to the service's other targets.",
		samples: perTarget(func(t *api.Target, emit func(float64, ...string)) {
			for _, l := range t.Actions {
				emit(l.Exact, l.Action)
			}
		})},
	{Name: "weir_target_action_fraction_percent", Type: Gauge, Labels: actionLabels,
		Help: "The QoS weight fraction of the target's service level of a policy action, in percent: the largest of the action's connection fraction, its MinRate verdict and the target's default fraction (part=default of weir_target_fraction_percent).",
		samples: perTarget(func(t *api.Target, emit func(float64, ...string)) {
			for _, l := range t.Actions {
				emit(float64(l.Fraction), l.Action)
			}
		})},
	{Name: "weir_target_data_segments_total", Type: Counter, Labels: dirLabels,
		Help:    "Data segments (with payload; pure ACKs never count) on the target's legs that the monitor covers (monitor.scope), by direction: from_target (the target's own, the monitor's default input) or to_target (weir's).",
		samples: perDirection(func(d *api.DirTotals) float64 { return float64(d.DataSegments) })},
	{Name: "weir_target_retransmitted_segments_total", Type: Counter, Labels: dirLabels,
		Help:    "Of those, retransmitted: divided by weir_target_data_segments_total, the loss ratio of that direction. On a via: host leg without the host capture from_target is unknown (0; /status says source=estimate).",
		samples: perDirection(func(d *api.DirTotals) float64 { return float64(d.Retransmitted) })},
	{Name: "weir_target_timeouts_total", Type: Counter, Labels: dirLabels,
		Help:    "Retransmission timeouts on those legs by direction (from_target: retransmissions after a silence longer than the flow's RTO estimate).",
		samples: perDirection(func(d *api.DirTotals) float64 { return float64(d.Timeouts) })},
	{Name: "weir_target_up", Type: Gauge, Labels: targetLabels,
		Help:    "1 while the target may be picked; 0 while a failed connect keeps it down for retryInterval, its health checks fail or outlier ejection keeps it out.",
		samples: perTarget(func(t *api.Target, emit func(float64, ...string)) { emit(bool01(!t.Down && t.HealthUp && !t.Ejected)) })},
	{Name: "weir_target_picked_total", Type: Counter, Labels: targetLabels,
		Help:    "Connections the balancer gave to the target.",
		samples: perTarget(func(t *api.Target, emit func(float64, ...string)) { emit(float64(t.Picked)) })},
	{Name: "weir_target_connect_failures_total", Type: Counter, Labels: targetLabels,
		Help:    "Connects to the target that failed; each takes the target out for retryInterval. Check that the target listens and is reachable.",
		samples: perTarget(func(t *api.Target, emit func(float64, ...string)) { emit(float64(t.Failed)) })},
	{Name: "weir_target_ejected", Type: Gauge, Labels: targetLabels,
		Help:    "1 while outlier ejection (balancer.ejection) keeps the target out after consecutive failures; it comes back by itself after ejection.for.",
		samples: perTarget(func(t *api.Target, emit func(float64, ...string)) { emit(bool01(t.Ejected)) })},
	{Name: "weir_target_ejections_total", Type: Counter, Labels: targetLabels,
		Help:    "Times outlier ejection took the target out; each is also one log line. Never more than ejection.maxPercent of a service's targets are out at once.",
		samples: perTarget(func(t *api.Target, emit func(float64, ...string)) { emit(float64(t.Ejections)) })},
	{Name: "weir_target_replies_total", Type: Counter, Labels: targetLabels,
		Help: "Replies of a udp target's request/response sessions (udp.responses set) whose latency was measured: the first datagram back after a client's datagram. Absent for other targets.",
		samples: perTarget(func(t *api.Target, emit func(float64, ...string)) {
			if t.Replies != nil {
				emit(float64(t.Replies.Total.Replies))
			}
		})},
	{Name: "weir_target_reply_latency_seconds", Type: Gauge, Labels: []string{"service", "target", "quantile"},
		Help: "A udp target's reply latency over the last complete sampling interval (monitor.samplingInterval), quantile 0.5 and 0.99, each within 1/16; absent for an interval with no reply. A p99 near udp.responseTimeout means replies are about to count as unanswered.",
		samples: perTarget(func(t *api.Target, emit func(float64, ...string)) {
			if r := t.Replies; r != nil && r.Interval.Replies > 0 {
				emit(r.Interval.P50/1e3, "0.5")
				emit(r.Interval.P99/1e3, "0.99")
			}
		})},
	{Name: "weir_target_skipped_at_limit_total", Type: Counter, Labels: targetLabels,
		Help:    "Picks that passed the target over because it was at maxConnections; a steady rise means the target's maxConnections is too low for its share.",
		samples: perTarget(func(t *api.Target, emit func(float64, ...string)) { emit(float64(t.SkippedAtLimit)) })},

	// Datapath.
	{Name: "weir_datapath_dropped_total", Type: Counter, Labels: []string{"reason"},
		Help: "Client packets dropped as malformed before the stack, by reason (truncated, bad_version, bad_ihl, bad_length, bad_l4, ext_chain, unsupported). Rising: a broken or hostile client; capture the front interface.",
		samples: func(st *api.Status, emit emitter) {
			for _, d := range st.Datapath.Dropped {
				emit(float64(d.Count), d.Reason)
			}
		}},
	{Name: "weir_datapath_egress_malformed_total", Type: Counter,
		Help:    "Packets toward clients the parser rejected; passed on unchanged and unmarked. Non-zero points at a stack bug: report it.",
		samples: one(func(st *api.Status) float64 { return float64(st.Datapath.EgressMalformed) })},
	{Name: "weir_datapath_fragments_total", Type: Counter,
		Help:    "Non-first IP fragments, passed on without classification or ToS marking. Many: clients send fragmented traffic; check the path MTU.",
		samples: one(func(st *api.Status) float64 { return float64(st.Datapath.Fragments) })},
	{Name: "weir_datapath_marked_total", Type: Counter,
		Help:    "Packets whose ToS a policy action (OutgoingTOS) rewrote.",
		samples: one(func(st *api.Status) float64 { return float64(st.Datapath.Marked) })},
	{Name: "weir_datapath_uncached_total", Type: Counter,
		Help:    "Packets classified without a flow entry because the flow table was full: they are served and marked, but not metered per target. Rising with weir_datapath_flows_refused_total: more concurrent flows than the table holds, or a SYN flood.",
		samples: one(func(st *api.Status) float64 { return float64(st.Datapath.Uncached) })},
	{Name: "weir_datapath_flows", Type: Gauge,
		Help:    "Flows in the datapath flow table now, idle ones not yet swept included.",
		samples: one(func(st *api.Status) float64 { return float64(st.Datapath.Flows.Live) })},
	{Name: "weir_datapath_flows_created_total", Type: Counter,
		Help:    "Flows the datapath flow table created.",
		samples: one(func(st *api.Status) float64 { return float64(st.Datapath.Flows.Inserted) })},
	{Name: "weir_datapath_flows_reclassified_total", Type: Counter,
		Help:    "Flow decisions redone after a configuration swap.",
		samples: one(func(st *api.Status) float64 { return float64(st.Datapath.Flows.Replaced) })},
	{Name: "weir_datapath_flows_expired_total", Type: Counter,
		Help:    "Flows removed from the flow table after their idle timeout, and half-open TCP flows (the client never sent its handshake ACK: a SYN flood's) within timeouts.handshake.",
		samples: one(func(st *api.Status) float64 { return float64(st.Datapath.Flows.Expired) })},
	{Name: "weir_datapath_flows_refused_total", Type: Counter,
		Help:    "Flow creations refused because their flow-table shard was full of confirmed flows (half-open ones are evicted first), one per packet run of a flow left without an entry (those packets count in weir_datapath_uncached_total); rising means more concurrent connections than the table holds, and those connections are not metered per target.",
		samples: one(func(st *api.Status) float64 { return float64(st.Datapath.Flows.Refused) })},
	{Name: "weir_datapath_flows_half_open", Type: Gauge,
		Help:    "Live TCP flows whose client has not sent its handshake ACK; a SYN flood's spoofed flows, gone within timeouts.handshake.",
		samples: one(func(st *api.Status) float64 { return float64(st.Datapath.Flows.HalfOpen) })},
	{Name: "weir_datapath_flows_evicted_total", Type: Counter,
		Help:    "Half-open flows removed from a full flow-table shard to make room for a new flow (a SYN flood filling the table).",
		samples: one(func(st *api.Status) float64 { return float64(st.Datapath.Flows.Evicted) })},

	// Host-leg capture.
	{Name: "weir_host_capture_up", Type: Gauge,
		Help:    "1 while the host-leg capture measures the via: host legs (AF_PACKET); 0 when it is off, could not be opened (no CAP_NET_RAW) or failed: their from_target is then TCP_INFO's estimate. /status host_capture.reason says why.",
		samples: one(func(st *api.Status) float64 { return bool01(st.HostCapture != nil && st.HostCapture.State == "on") })},
	{Name: "weir_host_capture_packets_total", Type: Counter,
		Help:    "Packets of via: host legs the host-leg capture read.",
		samples: one(func(st *api.Status) float64 { return hostCap(st, func(h *api.HostCapture) uint64 { return h.Packets }) })},
	{Name: "weir_host_capture_dropped_total", Type: Counter,
		Help:    "Packets of via: host legs the kernel dropped before the capture read them (its socket buffer overran): capture loss. An interval with any makes the host legs' sources partial. Rising: the host is too busy for the capture; a loaded host, or set monitor.hostCapture: off.",
		samples: one(func(st *api.Status) float64 { return hostCap(st, func(h *api.HostCapture) uint64 { return h.Dropped }) })},
	{Name: "weir_host_capture_malformed_total", Type: Counter,
		Help: "Captured packets the capture could not decode (an unknown link type, a header cut short).",
		samples: one(func(st *api.Status) float64 {
			return hostCap(st, func(h *api.HostCapture) uint64 { return h.Malformed })
		})},
	{Name: "weir_host_capture_forwarded_total", Type: Counter,
		Help: "Captured packets between a target and an address not the host's own: traffic the host forwards for others (a router's clients reaching the target directly), no leg of weir's; not tracked.",
		samples: one(func(st *api.Status) float64 {
			return hostCap(st, func(h *api.HostCapture) uint64 { return h.Forwarded })
		})},
	{Name: "weir_host_capture_flows", Type: Gauge,
		Help: "Host-leg TCP flows the capture tracks now.",
		samples: one(func(st *api.Status) float64 {
			return float64(hostCap(st, func(h *api.HostCapture) uint64 { return uint64(h.Flows) }))
		})},

	// Stack.
	{Name: "weir_stack_tcp_segments_sent_total", Type: Counter,
		Help:    "TCP segments weir's stack sent on both legs, retransmissions included.",
		samples: one(func(st *api.Status) float64 { return float64(st.Stack.TCPSegmentsSent) })},
	{Name: "weir_stack_tcp_retransmits_total", Type: Counter,
		Help:    "TCP segments weir's stack retransmitted; divided by segments sent, the loss weir sees (per target: weir_target_fraction_percent).",
		samples: one(func(st *api.Status) float64 { return float64(st.Stack.TCPRetransmits) })},
	{Name: "weir_stack_tcp_timeouts_total", Type: Counter,
		Help:    "TCP retransmission timeouts (RTO expiries) in weir's stack: stalled connections.",
		samples: one(func(st *api.Status) float64 { return float64(st.Stack.TCPTimeouts) })},
	{Name: "weir_stack_tcp_resets_sent_total", Type: Counter,
		Help:    "TCP RSTs weir's stack sent, refusals included.",
		samples: one(func(st *api.Status) float64 { return float64(st.Stack.TCPResetsSent) })},
	{Name: "weir_stack_syns_dropped_total", Type: Counter,
		Help:    "SYNs dropped for want of room: a VIP listener's accept queue full, or, for services without listeners (port ranges over 256), the in-flight bounds (inFlightPerVIP per VIP, 1024 in all); clients retry after a second. A flood at a listened VIP shows as weir_forwarder_syn_cookies_sent_total instead.",
		samples: one(func(st *api.Status) float64 { return float64(st.Stack.SYNsDroppedInFlight) })},
	{Name: "weir_stack_udp_no_socket_total", Type: Counter,
		Help:    "UDP datagrams to an address and port with no socket (no udp service), answered with ICMP port unreachable (rate-limited by the stack).",
		samples: one(func(st *api.Status) float64 { return float64(st.Stack.UDPNoSocket) })},
	{Name: "weir_stack_icmp_unreachables_sent_total", Type: Counter,
		Help:    "ICMP and ICMPv6 destination-unreachable messages weir's stack sent.",
		samples: one(func(st *api.Status) float64 { return float64(st.Stack.ICMPUnreachablesSent) })},
	{Name: "weir_stack_ip_malformed_total", Type: Counter,
		Help:    "IP packets weir's stack dropped as malformed after the datapath let them through.",
		samples: one(func(st *api.Status) float64 { return float64(st.Stack.IPMalformed) })},
	{Name: "weir_stack_tcp_checksum_errors_total", Type: Counter,
		Help:    "TCP segments weir's stack dropped for a bad checksum. Rising: a corrupting path, or hostile packets.",
		samples: one(func(st *api.Status) float64 { return float64(st.Stack.TCPChecksumErrors) })},
	{Name: "weir_stack_ip_fragments_refused_total", Type: Counter,
		Help:    "IP fragments reassembly refused: overlapping (the whole datagram is dropped), conflicting last fragments, or past 64 KiB. Tiny fragments are weir_datapath_dropped_total{reason=tiny_fragment}.",
		samples: one(func(st *api.Status) float64 { return float64(st.Stack.IPFragmentsRefused) })},

	// UDP services.
	{Name: "weir_udp_endpoints", Type: Gauge,
		Help:    "VIP and port endpoints of udp services open now: each VIP times each port of every udp service. Fewer than configured: see the error log (a range wider than 256 ports).",
		samples: one(func(st *api.Status) float64 { return float64(st.UDP.Endpoints) })},
	{Name: "weir_udp_target_dial_failures_total", Type: Counter,
		Help:    "udp session target sockets that could not be opened (no route to the target, no back arm); the next target is tried.",
		samples: one(func(st *api.Status) float64 { return float64(st.UDP.DialFailed) })},
	{Name: "weir_udp_sessions", Type: Gauge,
		Help:    "Open udp sessions (client address and port with VIP and port). Near the table bound (65536) or a service's udp.maxSessions: new sessions are being dropped.",
		samples: one(func(st *api.Status) float64 { return float64(st.UDP.Sessions) })},
	{Name: "weir_udp_sessions_created_total", Type: Counter,
		Help:    "udp sessions admitted; its rate is the new-session rate (a spoofed flood shows here and in the drops).",
		samples: one(func(st *api.Status) float64 { return float64(st.UDP.Created) })},
	{Name: "weir_udp_sessions_dropped_total", Type: Counter, Labels: []string{"reason"},
		Help: "New udp sessions whose datagram was dropped, nothing sent back: refused (admission: a limit, every target at maxConnections, no target, or every target socket failed), table_full (the session table's bound), vip_full (the VIP and port's udp.maxSessions).",
		samples: func(st *api.Status, emit emitter) {
			if !udpOn(st) {
				return
			}
			emit(float64(st.UDP.Refused), "refused")
			emit(float64(st.UDP.DroppedFull), "table_full")
			emit(float64(st.UDP.DroppedVIP), "vip_full")
		}},
	{Name: "weir_udp_sessions_ended_total", Type: Counter, Labels: []string{"reason"},
		Help: "udp sessions ended: idle (udp.idleTimeout), responses (udp.responses replies), unanswered (no reply within udp.responseTimeout: counted in the target's timeout ratio), error (the target socket failed: ICMP unreachable from the target, which marks it down), closed (shutdown).",
		samples: func(st *api.Status, emit emitter) {
			if !udpOn(st) {
				return
			}
			emit(float64(st.UDP.EndedIdle), "idle")
			emit(float64(st.UDP.EndedResponses), "responses")
			emit(float64(st.UDP.EndedUnanswered), "unanswered")
			emit(float64(st.UDP.EndedError), "error")
			emit(float64(st.UDP.EndedClosed), "closed")
		}},
	{Name: "weir_udp_datagrams_total", Type: Counter, Labels: []string{"direction"},
		Help: "Datagrams relayed by udp sessions: in (client to target), out (target to client).",
		samples: func(st *api.Status, emit emitter) {
			if !udpOn(st) {
				return
			}
			emit(float64(st.UDP.DatagramsIn), "in")
			emit(float64(st.UDP.DatagramsOut), "out")
		}},
	{Name: "weir_udp_bytes_total", Type: Counter, Labels: []string{"direction"},
		Help: "Payload bytes relayed by udp sessions: in (client to target), out (target to client).",
		samples: func(st *api.Status, emit emitter) {
			if !udpOn(st) {
				return
			}
			emit(float64(st.UDP.BytesIn), "in")
			emit(float64(st.UDP.BytesOut), "out")
		}},
	{Name: "weir_udp_datagrams_lost_total", Type: Counter, Labels: []string{"reason"},
		Help: "Datagrams of udp services lost inside weir: write_error (a socket refused it), receive_buffer (a VIP endpoint's receive buffer was full: the relay fell behind), no_service (its service was reloaded away).",
		samples: func(st *api.Status, emit emitter) {
			if !udpOn(st) {
				return
			}
			emit(float64(st.UDP.WriteErrors), "write_error")
			emit(float64(st.UDP.ReceiveDropped), "receive_buffer")
			emit(float64(st.UDP.NoService), "no_service")
		}},

	// Forwarder.
	{Name: "weir_forwarder_no_service_total", Type: Counter,
		Help:    "SYNs to an address and port that is no virtual server, answered with RST. Rising: clients use a VIP or port the configuration lacks.",
		samples: one(func(st *api.Status) float64 { return float64(st.Forwarder.NoService) })},
	{Name: "weir_forwarder_refused_shutdown_total", Type: Counter,
		Help:    "SYNs refused with RST because weir was shutting down.",
		samples: one(func(st *api.Status) float64 { return float64(st.Forwarder.RefusedClosed) })},
	{Name: "weir_forwarder_handshake_timeouts_total", Type: Counter,
		Help:    "Client handshakes aborted by the handshake timeout (timeouts.handshake): clients that send a SYN and never the ACK (a SYN flood, or a return path that loses weir's SYN-ACKs); on a VIP's listener, half-open handshakes past it, so that the VIP leaves SYN-cookie mode within timeouts.handshake of a flood's end.",
		samples: one(func(st *api.Status) float64 { return float64(st.Forwarder.HandshakeTimedOut) })},
	{Name: "weir_forwarder_handshake_failures_total", Type: Counter,
		Help:    "Client handshakes that failed otherwise (the client reset it).",
		samples: one(func(st *api.Status) float64 { return float64(st.Forwarder.HandshakeFailed) })},
	{Name: "weir_forwarder_idle_closed_total", Type: Counter,
		Help:    "Connections closed because no byte moved for the idle timeout.",
		samples: one(func(st *api.Status) float64 { return float64(st.Forwarder.IdleClosed) })},
	{Name: "weir_forwarder_time_wait_reopened_total", Type: Counter,
		Help:    "SYNs that ended a TIME_WAIT on their 4-tuple and opened a new connection at once (clients reusing ports quickly).",
		samples: one(func(st *api.Status) float64 { return float64(st.Forwarder.TimeWaitReopened) })},
	{Name: "weir_forwarder_cookie_replays_total", Type: Counter,
		Help:    "Connections a VIP listener made of a late segment of a connection that had ended (its SYN cookie still valid, no SYN since: an echo moves both sequence numbers alike), aborted before admission so that no target connection is opened for them.",
		samples: one(func(st *api.Status) float64 { return float64(st.Forwarder.CookieReplays) })},

	{Name: "weir_forwarder_aborted_total", Type: Counter,
		Help:    "Connections, pending or spliced, that weir ended because it shut down (after the drain grace, or on Close).",
		samples: one(func(st *api.Status) float64 { return float64(st.Forwarder.Aborted) })},
	{Name: "weir_forwarder_no_session_total", Type: Counter,
		Help:    "Admitted SYNs refused with RST because admission returned no session: a weir bug, report it with the log.",
		samples: one(func(st *api.Status) float64 { return float64(st.Forwarder.NoSession) })},
	{Name: "weir_forwarder_syn_cookies_sent_total", Type: Counter,
		Help:    "SYN-ACKs sent with a SYN cookie because a VIP's backlog of half-open handshakes (timeouts.inFlightPerVIP) was full: a SYN flood, answered without state.",
		samples: one(func(st *api.Status) float64 { return float64(st.Forwarder.SYNCookiesSent) })},
	{Name: "weir_forwarder_syn_cookies_valid_total", Type: Counter,
		Help:    "Connections established from a valid SYN cookie: real clients served during a flood.",
		samples: one(func(st *api.Status) float64 { return float64(st.Forwarder.SYNCookiesValid) })},
	{Name: "weir_forwarder_syn_cookies_invalid_total", Type: Counter,
		Help:    "ACKs to a VIP's listener that carried no valid cookie, dropped: an ACK flood or a late ACK.",
		samples: one(func(st *api.Status) float64 { return float64(st.Forwarder.SYNCookiesInvalid) })},
	{Name: "weir_forwarder_listen_dropped_total", Type: Counter, Labels: []string{"reason"},
		Help:    "Segments past the SYN that a VIP's listener dropped, by reason: segment_queue (the listener's queue refused it), accept_queue (a handshake-completing ACK, with any data it carried, while the accept queue was full), failed (the connection could not be made). Each costs its client a retransmission timeout; expected 0.",
		samples: func(st *api.Status, emit emitter) { drops(st.Forwarder.ListenDropped, emit) }},
	{Name: "weir_forwarder_sni_routed_total", Type: Counter,
		Help:    "Connections to tls services routed by the server name of their ClientHello (read without terminating TLS).",
		samples: one(func(st *api.Status) float64 { return float64(st.Forwarder.SNIRouted) })},
	{Name: "weir_forwarder_sni_refused_total", Type: Counter, Labels: []string{"reason"},
		Help:    "Connections to tls services reset before admission, by reason: not-tls (the first bytes are no TLS handshake record), malformed (a record or the ClientHello does not parse), oversized (a ClientHello over 16 KiB), timeout (no complete ClientHello within timeouts.handshake), eof (the client closed first), error (another read error), no-match (no tls service of the VIP and port answers the server name, and none is sni default).",
		samples: func(st *api.Status, emit emitter) { drops(st.Forwarder.SNIRefused, emit) }},
	{Name: "weir_forwarder_proxy_protocol_refused_total", Type: Counter, Labels: []string{"reason"},
		Help:    "Connections to a service with acceptProxyProtocol refused for their PROXY-protocol header (RST for tcp, 400 for http), by reason: untrusted (the sender is outside trustedProxies), missing (no header of an accepted version), malformed, timeout (no whole header within timeouts.handshake), error. Rising untrusted or missing: clients bypass the outer load balancer, or it sends no (or the other version's) header.",
		samples: func(st *api.Status, emit emitter) { drops(st.Forwarder.ProxyRefused, emit) }},
	{Name: "weir_forwarder_listeners", Type: Gauge,
		Help:    "VIP and port pairs weir listens on (SYN cookies, per-VIP backlogs).",
		samples: one(func(st *api.Status) float64 { return float64(st.Forwarder.Listeners) })},
	{Name: "weir_forwarder_target_timeouts_total", Type: Counter,
		Help:    "Connections whose target sent nothing within timeouts.firstByte after the client's first byte; the target rests retryInterval and the client got the 503 page or a RST.",
		samples: one(func(st *api.Status) float64 { return float64(st.Forwarder.TargetTimedOut) })},
	{Name: "weir_panics_total", Type: Counter,
		Help:    "Panics recovered in a connection's goroutines; each closed its connection only and was logged with its stack. Any: a weir bug, report it with the log.",
		samples: one(func(st *api.Status) float64 { return float64(st.Forwarder.Panics) })},

	// HTTP requests (services with protocol http, proxied request by request).
	{Name: "weir_requests_total", Type: Counter, Labels: []string{"service", "target", "code"},
		Help: "Finished http requests by the status weir sent the client; target is empty for a request no target served (refused with 503, or 400/408/431 before admission).",
		samples: func(st *api.Status, emit emitter) {
			for _, r := range st.HTTP.Requests {
				emit(float64(r.Count), r.Service, r.Target, r.Code)
			}
		}},
	{Name: "weir_requests_in_flight", Type: Gauge, Labels: targetLabels,
		Help: "Http requests admitted and not yet answered completely, per target: what maxConnections counts for an http service (the plug-in's pendingConnections).",
		samples: func(st *api.Status, emit emitter) {
			for _, r := range st.HTTP.InFlight {
				emit(float64(r.InFlight), r.Service, r.Target)
			}
		}},
	{Name: "weir_request_duration_seconds", Type: Histogram, Labels: []string{"service"},
		Help: "Http request durations, from the parsed head to the last response byte written. A rising tail with flat weights: the targets are slow, not the network.",
		histograms: func(st *api.Status, emit func(uint64, float64, map[float64]uint64, ...string)) {
			for _, h := range st.HTTP.Durations {
				b := make(map[float64]uint64, len(h.Bounds))
				for i, ub := range h.Bounds {
					if i < len(h.Cumulative) {
						b[ub] = h.Cumulative[i]
					}
				}
				emit(h.Count, h.Sum, b, h.Service)
			}
		}},
	{Name: "weir_http_client_connections", Type: Gauge, Labels: []string{"service", "kind"},
		Help: "Open client connections of each http service (kind open; their sum is all http client connections) and their bound maxClients (kind max, where set); they hold no request slot while idle. At the max, new clients get the 503 page naming maxClients.",
		samples: func(st *api.Status, emit emitter) {
			for _, s := range st.Services {
				if s.Proto == "http" {
					emit(float64(s.Clients), s.Name, "open")
				}
				if s.MaxClients > 0 {
					emit(float64(s.MaxClients), s.Name, "max")
				}
			}
		}},
	{Name: "weir_http_requests_parsed_total", Type: Counter,
		Help:    "Http request heads parsed (every request that reached admission).",
		samples: one(func(st *api.Status) float64 { return float64(st.Forwarder.HTTPRequests) })},
	{Name: "weir_http_requests_refused_total", Type: Counter,
		Help:    "Http requests answered with the 503 page (a limit, or no target could serve); weir_refusals_total says which.",
		samples: one(func(st *api.Status) float64 { return float64(st.Forwarder.HTTPRefused) })},
	{Name: "weir_http_header_timeouts_total", Type: Counter,
		Help:    "Http request heads not complete within http.headerTimeout, answered 408 and closed (slowloris clients end here).",
		samples: one(func(st *api.Status) float64 { return float64(st.Forwarder.HTTPHeaderTimeout) })},
	{Name: "weir_http_header_too_big_total", Type: Counter,
		Help:    "Http request heads larger than http.maxHeaderBytes, answered 431 and closed.",
		samples: one(func(st *api.Status) float64 { return float64(st.Forwarder.HTTPHeaderTooBig) })},
	{Name: "weir_http_malformed_total", Type: Counter,
		Help:    "Http requests answered 400 and closed: a malformed head, Content-Length together with Transfer-Encoding (request smuggling), a folded header line, no valid Host, or a body the client malformed or cut short (the target is not blamed); CONNECT (501) and versions other than HTTP/1.x (505) too.",
		samples: one(func(st *api.Status) float64 { return float64(st.Forwarder.HTTPBadRequest) })},
	{Name: "weir_http_requests_retried_total", Type: Counter,
		Help:    "Idempotent http requests sent again on a fresh target connection because the pooled one had been closed by the target. Many: lower backendIdle below the targets' keep-alive timeout.",
		samples: one(func(st *api.Status) float64 { return float64(st.Forwarder.HTTPRetried) })},
	{Name: "weir_http_bad_gateway_total", Type: Counter,
		Help:    "Http requests whose target failed in mid-exchange (502 to the client, or a cut response).",
		samples: one(func(st *api.Status) float64 { return float64(st.Forwarder.HTTPBadGateway) })},
	{Name: "weir_http_undelivered_total", Type: Counter,
		Help:    "Of weir_http_bad_gateway_total, http requests the target had not acknowledged whole when timeouts.firstByte ran out: the path lost them (or weir's sender stalled), so the 502 does not mark the target down.",
		samples: one(func(st *api.Status) float64 { return float64(st.Forwarder.HTTPUndelivered) })},
	{Name: "weir_http_body_timeouts_total", Type: Counter,
		Help:    "Admitted http requests whose client sent no byte of its body for the idle timeout, answered 408 and closed (the target is not blamed).",
		samples: one(func(st *api.Status) float64 { return float64(st.Forwarder.HTTPBodyTimeout) })},
	{Name: "weir_http_target_connections", Type: Gauge,
		Help:    "Target connections of http services open now, in use or pooled.",
		samples: one(func(st *api.Status) float64 { return float64(st.Forwarder.TargetConns) })},
	{Name: "weir_http_target_connections_idle", Type: Gauge,
		Help:    "Target connections of http services idle in the pool now (at most http.maxIdlePerTarget per target).",
		samples: one(func(st *api.Status) float64 { return float64(st.Forwarder.TargetConnsIdle) })},

	// NICs and transports.
	{Name: "weir_nic_packets_total", Type: Counter, Labels: []string{"nic", "direction"},
		Help: "Packets through each stack interface: rx handed to the stack, tx written to the transport.",
		samples: perNIC(func(n *api.NIC, emit func(float64, ...string)) {
			emit(float64(n.RxPackets), "rx")
			emit(float64(n.TxPackets), "tx")
		})},
	{Name: "weir_nic_bytes_total", Type: Counter, Labels: []string{"nic", "direction"},
		Help: "Bytes of weir_nic_packets_total.",
		samples: perNIC(func(n *api.NIC, emit func(float64, ...string)) {
			emit(float64(n.RxBytes), "rx")
			emit(float64(n.TxBytes), "tx")
		})},
	{Name: "weir_nic_acks_coalesced_total", Type: Counter, Labels: []string{"nic"},
		Help:    "Pure ACKs read on each stack interface and not handed to the stack: a later ACK of the same flow in the same read batch acknowledged more (downloads: the sender gets the room at once and writes larger super-packets). Not in weir_nic_packets_total.",
		samples: perNIC(func(n *api.NIC, emit func(float64, ...string)) { emit(float64(n.RxCoalesced)) })},
	{Name: "weir_nic_dropped_total", Type: Counter, Labels: []string{"nic", "reason"},
		Help:    "Packets a stack interface dropped: queue_full (the transport writes slower than the stack sends: add TUN queues with --queues), too_big (over the MTU), malformed, detached (before start), closed (after close), checksum (a bad TCP or UDP checksum the kernel left unverified, on an offload TUN).",
		samples: perNIC(func(n *api.NIC, emit func(float64, ...string)) { drops(n.Dropped, emit) })},
	{Name: "weir_nic_errors_total", Type: Counter, Labels: []string{"nic", "op"},
		Help:    "Failed transport calls of a stack interface (op read, write, write_short: packets a write did not take); rising means the TUN or its queue is failing, see the error log.",
		samples: perNIC(func(n *api.NIC, emit func(float64, ...string)) { drops(n.Errors, emit) })},
	{Name: "weir_transport_dropped_total", Type: Counter, Labels: []string{"nic", "reason"},
		Help: "Packets the transport below a stack interface (a TUN queue, a memory pair) dropped itself: queue_full, too_big, or write_refused (the kernel refused a written packet's header). Absent when the transport keeps no counters.",
		samples: perNIC(func(n *api.NIC, emit func(float64, ...string)) {
			if d := n.Device; d != nil {
				emit(float64(d.DroppedFull), "queue_full")
				emit(float64(d.DroppedTooBig), "too_big")
				emit(float64(d.WriteErrors), "write_refused")
			}
		})},
	{Name: "weir_tun_kernel_dropped_total", Type: Counter, Labels: []string{"tun", "direction"},
		Help: "Packets the kernel dropped at weir's TUN interface, all queues: direction to_weir (the TUN's queue was full: weir reads too slowly; add --queues) or from_weir (packets weir wrote that the kernel dropped: no route back to the client).",
		samples: func(st *api.Status, emit emitter) {
			if t := st.TUN; t != nil {
				emit(float64(t.ToWeirDropped), t.Name, "to_weir")
				emit(float64(t.FromWeirDropped), t.Name, "from_weir")
			}
		}},
	{Name: "weir_tun_kernel_errors_total", Type: Counter, Labels: []string{"tun", "direction"},
		Help: "Packets the kernel failed to queue toward weir (direction to_weir) or refused from weir (from_weir, a bad header) at weir's TUN interface.",
		samples: func(st *api.Status, emit emitter) {
			if t := st.TUN; t != nil {
				emit(float64(t.ToWeirErrors), t.Name, "to_weir")
				emit(float64(t.FromWeirErrors), t.Name, "from_weir")
			}
		}},

	// The cluster (absent without a cluster section).
	{Name: "weir_cluster_redis_reachable", Type: Gauge,
		Help:    "1 while the last lease renewal reached Redis; 0 while the instance runs on its onRedisDown fallback (weir status shows the error).",
		samples: perCluster(func(c *api.Cluster, emit emitter) { emit(bool01(c.Reachable)) })},
	{Name: "weir_cluster_redis_outages_total", Type: Counter,
		Help:    "Times Redis became unreachable (each logged once). Limits then follow onRedisDown until it answers.",
		samples: perCluster(func(c *api.Cluster, emit emitter) { emit(float64(c.Outages)) })},
	{Name: "weir_cluster_redis_round_trips_total", Type: Counter, Labels: []string{"kind"},
		Help: "Round trips to Redis by kind: lease (membership and connection leases, one per lease interval and on demand), bandwidth (one per recompute interval while a level has a maxBandwidth), samples (one per sampling interval). See docs/cluster.md, Cost.",
		samples: perCluster(func(c *api.Cluster, emit emitter) {
			emit(float64(c.Renewals), "lease")
			emit(float64(c.BandwidthRounds), "bandwidth")
			emit(float64(c.SampleRounds), "samples")
		})},
	{Name: "weir_cluster_fallbacks_total", Type: Counter, Labels: []string{"kind"},
		Help: "Bandwidth publications that took the onRedisDown fallback (two failed in a row), and sample exchanges that failed (the instance judged its own samples).",
		samples: perCluster(func(c *api.Cluster, emit emitter) {
			emit(float64(c.BandwidthFallbacks), "bandwidth")
			emit(float64(c.SampleFallbacks), "samples")
		})},
	{Name: "weir_cluster_client_admissions_total", Type: Counter, Labels: []string{"result"},
		Help: "Connections of a client with an enforced per-client maxConnections judged cluster-wide: admitted or refused by Redis's count, fallback when judged here alone (Redis down, an error or no answer within borrowTimeout; onRedisDown applies).",
		samples: perCluster(func(c *api.Cluster, emit emitter) {
			emit(float64(c.Clients.Admitted), "admitted")
			emit(float64(c.Clients.Refused), "refused")
			emit(float64(c.Clients.Fallbacks), "fallback")
		})},
	{Name: "weir_cluster_client_writes_total", Type: Counter, Labels: []string{"result"},
		Help: "Round trips for per-client counts: all, the batched records of counts that changed without an admission (releases); error, the failed round trips of admissions and records (a failed record is kept and written again).",
		samples: perCluster(func(c *api.Cluster, emit emitter) {
			emit(float64(c.Clients.Writes), "all")
			emit(float64(c.Clients.Errors), "error")
		})},
	{Name: "weir_cluster_client_counts_pending", Type: Gauge,
		Help:    "Per-client counts changed here and not yet recorded in Redis.",
		samples: perCluster(func(c *api.Cluster, emit emitter) { emit(float64(c.Clients.Pending)) })},
	{Name: "weir_cluster_members", Type: Gauge,
		Help:    "Live instances as the last renewal saw them; weir_cluster_sample_members those whose samples were summed in the last sampling interval.",
		samples: perCluster(func(c *api.Cluster, emit emitter) { emit(float64(len(c.Members))) })},
	{Name: "weir_cluster_sample_members", Type: Gauge,
		Help:    "Members whose target samples the last sampling interval summed: every member judges the same sums.",
		samples: perCluster(func(c *api.Cluster, emit emitter) { emit(float64(c.SampleMembers)) })},
	{Name: "weir_cluster_member_seen_seconds", Type: Gauge, Labels: []string{"member"},
		Help: "Seconds since each member last renewed; one above the lease lifetime (3 lease intervals) is gone at the next renewal.",
		samples: perCluster(func(c *api.Cluster, emit emitter) {
			for _, m := range c.Members {
				emit(m.SeenSeconds, m.ID)
			}
		})},
	{Name: "weir_cluster_limit_max", Type: Gauge, Labels: levelLabels,
		Help:    "A shared connection limit, cluster-wide (level target: name is service/target).",
		samples: perClusterLevel(func(l *api.ClusterLevel) float64 { return float64(l.Limit) })},
	{Name: "weir_cluster_limit_share", Type: Gauge, Labels: levelLabels,
		Help:    "The slots of a shared connection limit this instance holds: the connections it may open there now.",
		samples: perClusterLevel(func(l *api.ClusterLevel) float64 { return float64(l.Share) })},
	{Name: "weir_cluster_limit_held", Type: Gauge, Labels: levelLabels,
		Help:    "The slots every member holds together at the last renewal: at least the cluster's open connections, at most weir_cluster_limit_max.",
		samples: perClusterLevel(func(l *api.ClusterLevel) float64 { return float64(l.Held) })},
	{Name: "weir_cluster_limit_refused_total", Type: Counter, Labels: levelLabels,
		Help:    "Connections (or picks of a target) refused here because this instance's share was full below the cluster-wide limit; the share grows with the demand within a tenth of a lease interval.",
		samples: perClusterLevel(func(l *api.ClusterLevel) float64 { return float64(l.Refused) })},
	{Name: "weir_cluster_bandwidth_bytes_per_second", Type: Gauge, Labels: []string{"level", "name", "scope"},
		Help: "A level's window rate judged against its maxBandwidth: scope cluster (every member's, one recompute interval behind) and local (this instance's).",
		samples: perCluster(func(c *api.Cluster, emit emitter) {
			for _, b := range c.Bandwidth {
				emit(float64(b.Cluster), b.Level, b.Name, "cluster")
				emit(float64(b.Local), b.Level, b.Name, "local")
			}
		})},

	{Name: "weir_cluster_logged_connections", Type: Gauge, Labels: []string{"level", "name", "scope"},
		Help: "Open connections at a level whose maxConnections is only logged: scope cluster (every member's, as the log line counts them) and local.",
		samples: perCluster(func(c *api.Cluster, emit emitter) {
			for _, l := range c.Logged {
				emit(float64(l.Cluster), l.Level, l.Name, "cluster")
				emit(float64(l.Local), l.Level, l.Name, "local")
			}
		})},

	// The control plane.
	{Name: "weir_log_lines_dropped_total", Type: Counter,
		Help:    "Log lines lost because the log writer could not keep up (stderr blocked or slow); lower the log level or fix the collector reading stderr.",
		samples: one(func(st *api.Status) float64 { return float64(st.Control.DroppedLogLines) })},
	{Name: "weir_admission_events_dropped_total", Type: Counter,
		Help:    "Limit-crossing events lost because the control loop did not drain them in time: their log lines are missing, the limits were still enforced.",
		samples: one(func(st *api.Status) float64 { return float64(st.Control.DroppedEvents) })},
}

// collector reads one status document per scrape and exports Defs from it.
type collector struct {
	status func() api.Status
	descs  []*prometheus.Desc
}

// NewCollector returns a Prometheus collector of Defs over the documents
// status returns; status is called once per scrape.
func NewCollector(status func() api.Status) prometheus.Collector {
	c := &collector{status: status, descs: make([]*prometheus.Desc, len(Defs))}
	for i, d := range Defs {
		c.descs[i] = prometheus.NewDesc(d.Name, d.Help, d.Labels, nil)
	}
	return c
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	st := c.status()
	for i := range Defs {
		d, desc := &Defs[i], c.descs[i]
		vt := prometheus.GaugeValue
		if d.Type == Counter {
			vt = prometheus.CounterValue
		}
		if d.Type == Histogram {
			d.histograms(&st, func(count uint64, sum float64, buckets map[float64]uint64, labels ...string) {
				ch <- prometheus.MustNewConstHistogram(desc, count, sum, buckets, labels...)
			})
			continue
		}
		d.samples(&st, func(v float64, labels ...string) {
			ch <- prometheus.MustNewConstMetric(desc, vt, v, labels...)
		})
	}
}
