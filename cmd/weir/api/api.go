// Package api is the typed document weir's admin API serves at /status:
// `weir run` fills it, `weir status` prints it, the Prometheus collector
// exports it and the VM harness reads it. It depends on the standard
// library only, so a client links neither gVisor nor the datapath; a test
// keeps it that way.
//
// Every counter is a total since the process started (a reload never resets
// one); every gauge is a value now. JSON names are snake_case, durations are
// nanoseconds, times RFC 3339.
package api

import "time"

// Status is the appliance's state at one moment.
type Status struct {
	Instance    string       `json:"instance"`               // instance name from the configuration
	Source      string       `json:"source,omitempty"`       // where the configuration came from (a file)
	Generation  int64        `json:"generation"`             // 1 at start, +1 per reload swapped in
	LoadedAt    time.Time    `json:"loaded_at"`              // when the running configuration was swapped in
	ReloadError *ReloadError `json:"reload_error,omitempty"` // the last rejected configuration, until a reload succeeds
	Reloads     uint64       `json:"reloads"`                // configurations swapped in after the first
	// ReloadFailures counts configurations rejected (unparsable or invalid);
	// the previous configuration kept running each time.
	ReloadFailures uint64 `json:"reload_failures"`
	Draining       bool   `json:"draining"` // new connections are refused while open ones finish

	Open   int    `json:"open_connections"`   // admitted connections not yet closed
	Closed uint64 `json:"closed_connections"` // admitted connections that ended
	// DialFailures counts failed connects to targets: the sum of every
	// target's Failed, including targets a reload removed.
	DialFailures uint64 `json:"dial_failures"`

	Levels []Level `json:"levels"` // instance, classes, virtual servers: limits and measurements
	// Clients are the per-client limit tables (clientLimits).
	Clients   []ClientTable `json:"clients,omitempty"`
	Services  []Service     `json:"services"`   // virtual servers in configuration order
	SampledAt time.Time     `json:"sampled_at"` // end of the sampling interval the weight explanations are from
	// Refusals counts refused connections by level and limit, sorted by
	// level then limit.
	Refusals []Refusal `json:"refusals"`

	Datapath  Datapath  `json:"datapath"`
	Stack     Stack     `json:"stack"`
	Forwarder Forwarder `json:"forwarder"`
	NICs      []NIC     `json:"nics"`          // the stack's interfaces: front (and its queues), back arms
	TUN       *TUN      `json:"tun,omitempty"` // the front TUN interface's kernel counters, when the front is a TUN
	Control   Control   `json:"control"`
	// Cluster is the scale-out state; absent without a cluster section.
	Cluster *Cluster `json:"cluster,omitempty"`
	// HTTP is the request-level state of http services.
	HTTP HTTP `json:"http"`
	// UDP is the session state of udp services.
	UDP UDP `json:"udp"`
	// HostCapture is the host-leg capture's state: how the via: host
	// target legs are measured.
	HostCapture *HostCapture `json:"host_capture,omitempty"`
}

// UDP is the udp services' sessions and VIP endpoints: totals since start
// except Sessions and Endpoints. A session is one client address and port
// with its VIP and port; In is client → target, Out target → client.
type UDP struct {
	Sessions  int64  `json:"sessions"`  // open now
	Endpoints int    `json:"endpoints"` // VIP and port endpoints open now
	Created   uint64 `json:"created"`   // sessions admitted (their rate is the new-session rate)
	// Refused: new sessions' datagrams dropped because admission refused
	// them (a limit, maxConnections of every target, no target); nothing
	// is sent back. DroppedFull: the session table was full;
	// DroppedVIP: the VIP and port had udp.maxSessions open.
	Refused     uint64 `json:"refused"`
	DroppedFull uint64 `json:"dropped_table_full"`
	DroppedVIP  uint64 `json:"dropped_vip_full"`
	DialFailed  uint64 `json:"dial_failed"`
	// Ended sessions by reason: idle (udp.idleTimeout), responses
	// (udp.responses replies), unanswered (no reply within
	// udp.responseTimeout), error (the target's socket failed: ICMP
	// unreachable), closed (shutdown).
	EndedIdle       uint64 `json:"ended_idle"`
	EndedResponses  uint64 `json:"ended_responses"`
	EndedUnanswered uint64 `json:"ended_unanswered"`
	EndedError      uint64 `json:"ended_error"`
	EndedClosed     uint64 `json:"ended_closed"`
	// Datagrams and payload bytes relayed per direction.
	DatagramsIn  uint64 `json:"datagrams_in"`
	DatagramsOut uint64 `json:"datagrams_out"`
	BytesIn      uint64 `json:"bytes_in"`
	BytesOut     uint64 `json:"bytes_out"`
	// WriteErrors: datagrams lost because a socket refused them;
	// ReceiveDropped: datagrams a VIP endpoint's full receive buffer
	// dropped before the relay read them; NoService: datagrams read whose
	// service a reload had removed.
	WriteErrors    uint64 `json:"write_errors"`
	ReceiveDropped uint64 `json:"receive_dropped"`
	NoService      uint64 `json:"no_service"`
}

// HostCapture is the state of the capture that measures via: host target
// legs (datapath/hostcap): an AF_PACKET socket whose kernel filter keeps
// the targets' TCP segments.
type HostCapture struct {
	// State is "on", "off" (monitor.hostCapture: off, or it could not be
	// opened: Reason says which) or "failed" (its reader stopped).
	State  string `json:"state"`
	Reason string `json:"reason,omitempty"`
	// Targets is the via: host targets of the running configuration.
	Targets int `json:"targets"`
	// Packets the filter kept and the reader decoded; Dropped the ones the
	// kernel dropped because the reader fell behind (capture loss, totals);
	// DroppedLastInterval those of the last sampling interval (its via:
	// host directions were then partial).
	Packets             uint64 `json:"packets"`
	Dropped             uint64 `json:"dropped"`
	DroppedLastInterval uint64 `json:"dropped_last_interval"`
	Malformed           uint64 `json:"malformed"`
	Refused             uint64 `json:"refused"` // packets of flows not tracked: the flow table was full
	// Forwarded counts packets between a target and an address not the
	// host's own: traffic the host forwards for others, no leg of weir's,
	// not tracked.
	Forwarded uint64 `json:"forwarded"`
	Flows     int    `json:"flows"` // flows tracked now
}

// HTTP counts the requests of http services: each request is admitted and
// routed on its own, from its parsed head to its last response byte.
type HTTP struct {
	// Requests counts finished requests by service, target ("" for a
	// request no target served: refused, or bad) and status code, sorted.
	Requests []RequestCount `json:"requests"`
	// InFlight is the requests admitted and not yet answered, by service
	// and target (the plug-in's pendingConnections), sorted.
	InFlight []RequestsInFlight `json:"in_flight"`
	// Durations are the request durations per service, head parsed to
	// response written.
	Durations []RequestDurations `json:"durations"`
}

// RequestCount is a count of finished requests.
type RequestCount struct {
	Service string `json:"service"`
	Target  string `json:"target"`
	Code    string `json:"code"`
	Count   uint64 `json:"count"`
}

// RequestsInFlight is the requests pending at one target now.
type RequestsInFlight struct {
	Service  string `json:"service"`
	Target   string `json:"target"`
	InFlight int64  `json:"in_flight"`
}

// RequestDurations is a histogram of request durations, seconds.
type RequestDurations struct {
	Service    string    `json:"service"`
	Bounds     []float64 `json:"bounds"`     // upper bounds, seconds
	Cumulative []uint64  `json:"cumulative"` // requests at or under each bound
	Count      uint64    `json:"count"`
	Sum        float64   `json:"sum"` // seconds
}

// ReloadError is a rejected configuration.
type ReloadError struct {
	At  time.Time `json:"at"`
	Err string    `json:"error"`
}

// Level is one QoS level's limits and statistics.
type Level struct {
	Level              string `json:"level"` // "instance", "class" or "virtual server"
	Name               string `json:"name"`
	Connections        int64  `json:"connections"`               // counted now (requests for http services)
	MaxConnections     int64  `json:"max_connections,omitempty"` // 0: no limit
	EnforceConnections bool   `json:"enforce_connections,omitempty"`
	Bandwidth          int64  `json:"bandwidth"`               // bytes/s over the metric interval
	MaxBandwidth       int64  `json:"max_bandwidth,omitempty"` // bytes/s; 0: no limit
	EnforceBandwidth   bool   `json:"enforce_bandwidth,omitempty"`
	Over               bool   `json:"over,omitempty"`    // a limit is exceeded now
	Retired            bool   `json:"retired,omitempty"` // gone from the configuration, kept until its connections end
	// Queue is the level's queue at maxConnections (limits.queue); absent
	// without one.
	Queue *Queue `json:"queue,omitempty"`
}

// Queue is a queue at a connection limit: of a level, or of all the
// clients of a client table.
type Queue struct {
	Limit     int64   `json:"limit"`      // the queue's length bound (limits.queue)
	TimeoutMs int64   `json:"timeout_ms"` // queueTimeout
	Waiting   int64   `json:"waiting"`    // connections (requests) waiting now
	Waits     uint64  `json:"waits"`      // joined the queue since start
	Served    uint64  `json:"served"`     // left it admitted
	TimedOut  uint64  `json:"timed_out"`  // refused when queueTimeout passed
	Full      uint64  `json:"full"`       // refused at once: the queue was full
	WaitedSec float64 `json:"waited_seconds"`
}

// ClientTable is one scope's per-client limits (clientLimits): the
// instance's (Scope "") or a service's.
type ClientTable struct {
	Scope              string `json:"scope"` // the service, "" for the instance
	MaxConnections     int64  `json:"max_connections,omitempty"`
	EnforceConnections bool   `json:"enforce_connections,omitempty"`
	MaxBandwidth       int64  `json:"max_bandwidth,omitempty"`
	EnforceBandwidth   bool   `json:"enforce_bandwidth,omitempty"`
	PrefixV4           int    `json:"prefix_v4"`
	PrefixV6           int    `json:"prefix_v6"`
	Clients            int    `json:"clients"` // entries kept
	Active             int    `json:"active"`  // with a connection open or queued
	Size               int    `json:"size"`    // tableSize
	// Refused counts connections refused at a client limit, Overflow the
	// clients admitted without one because the table was full of active
	// clients, Evicted the idle clients dropped to make room.
	Refused  uint64 `json:"refused"`
	Overflow uint64 `json:"overflow"`
	Evicted  uint64 `json:"evicted"`
	Queue    *Queue `json:"queue,omitempty"`
}

// Service is one virtual server with its balancer's targets.
type Service struct {
	Name  string   `json:"name"`
	Proto string   `json:"protocol"` // "http" or "tcp"
	VIPs  []string `json:"vips"`
	Ports string   `json:"ports"`
	Class string   `json:"class,omitempty"`
	// Refused counts connections refused because no target could serve
	// (all down, unhealthy or at maxConnections).
	Refused  uint64 `json:"refused_no_target"`
	Balancer string `json:"algorithm"`
	// HashBy is what maglev hashes (connection, client, header:NAME or
	// cookie:NAME); empty for the other algorithms.
	HashBy  string   `json:"hash_by,omitempty"`
	Targets []Target `json:"targets"`
	// Clients is the open client connections of an http service now and
	// MaxClients their bound (apart from the request limits).
	Clients    int64 `json:"clients,omitempty"`
	MaxClients int64 `json:"max_clients,omitempty"`
}

// Target is one target's balancer state and its last weight explanation.
type Target struct {
	Name      string `json:"name"`
	Addr      string `json:"addr"`
	Role      string `json:"role"`      // "primary" or "backup"
	Weight    int    `json:"weight"`    // WLM weight from the configuration
	Effective int    `json:"effective"` // weight after the QoS fraction, rounded down (at least 1 while the fraction is below 100 %)
	// Exact is the default level's weight the balancer balances on,
	// unrounded (weight 1 at 25 % is 0.75): new connections under no
	// policy action, at the fraction Explanation.DefaultFraction.
	Exact float64 `json:"exact"`
	// Actions are the service levels with weights of their own, by action
	// name: each policy action with connections to one of the service's
	// targets in the last sampling interval. New connections under any
	// other action are balanced on the default level.
	Actions   []ActionLevel `json:"actions,omitempty"`
	SlowStart float64       `json:"slow_start"` // slow-start factor in (0, 1]; 1 at full weight
	Open      int64         `json:"open"`       // open connections
	Max       int64         `json:"max"`        // maxConnections; ≤ 0: no limit
	// Down is set while a failed connect keeps the target out, until
	// DownUntil.
	Down      bool      `json:"down"`
	DownUntil time.Time `json:"down_until"`
	HealthUp  bool      `json:"health_up"` // false while health checks fail
	// Check is the last active health check, absent before the first.
	Check *HealthCheck `json:"check,omitempty"`
	// SkippedAtLimit counts picks that passed the target over because it
	// was at maxConnections.
	SkippedAtLimit uint64 `json:"skipped_at_limit"`
	Picked         uint64 `json:"picked"` // connections given to the target
	Failed         uint64 `json:"failed"` // connects that failed
	// Ejected is set while outlier ejection (balancer.ejection) keeps the
	// target out, until EjectedUntil; Ejections counts its ejections.
	Ejected      bool         `json:"ejected,omitempty"`
	EjectedUntil time.Time    `json:"ejected_until,omitzero"`
	Ejections    uint64       `json:"ejections"`
	Explanation  *Explanation `json:"explanation,omitempty"`
	// Segments are the target's data segments per direction since start.
	Segments *Segments `json:"segments,omitempty"`
	// Replies is the reply latency of a udp target's request/response
	// sessions (udp.responses set), absent before its first one.
	Replies *ReplyLatency `json:"replies,omitempty"`
}

// ReplyLatency is a udp target's reply latency: the time from a client's
// datagram to the target's answer to it (a datagram sent while an earlier
// one waits counts from the earlier), over the last complete sampling
// interval and since start.
type ReplyLatency struct {
	Interval LatencySummary `json:"interval"`
	Total    LatencySummary `json:"total"`
}

// LatencySummary is a count of replies and their latency quantiles, each
// within 1/16 of the true value; zero without replies.
type LatencySummary struct {
	Replies uint64  `json:"replies"`
	P50     float64 `json:"p50_ms"`
	P99     float64 `json:"p99_ms"`
}

// HealthCheck is a target's last active health check and its count toward
// the next change: Streak of Need failures in a row (fall) while the target
// is up, passes in a row (rise) while it is down.
type HealthCheck struct {
	At     time.Time `json:"at"`
	OK     bool      `json:"ok"`
	Reason string    `json:"reason,omitempty"` // refused, timeout, unreachable, reset, closed, status 503, expect mismatch, bad response
	Streak int       `json:"streak"`
	Need   int       `json:"need"`
}

// ActionLevel is one policy action's service level at a target: the
// fraction and weight the target's new connections classified to that
// action are balanced on (the z/OS Policy Action fraction "for a target's
// DVIPA/Port … using that service level").
type ActionLevel struct {
	Action string `json:"action"`
	// Fraction is the action's fraction here in percent: the largest of
	// its connection fraction, its MinRate verdict and the default
	// fraction (Explanation.Levels); the default fraction alone while the
	// action has no connections to this target.
	Fraction  int     `json:"fraction"`
	Exact     float64 `json:"exact"`     // the weight balanced on, unrounded
	Effective int     `json:"effective"` // rounded down, at least 1 while Fraction is below 100 %
}

// Segments are one target's data segments per direction, totals since
// start over the connections the monitor's scope covers (monitor.scope).
// They grow once per sampling interval.
type Segments struct {
	FromTarget DirTotals `json:"from_target"` // the target's segments toward weir
	ToTarget   DirTotals `json:"to_target"`   // weir's segments toward the target
	// Direction is the one the last interval's loss and timeout ratios
	// read: from_target or to_target (monitor.direction; an unmeasured
	// direction gives way to the other).
	Direction string `json:"direction"`
	// DirectionWhy says why: monitor.direction, and the direction it gave
	// way from when that one was not measured.
	DirectionWhy string `json:"direction_why,omitempty"`
}

// DirTotals are one direction's totals. Data segments carry payload; pure
// ACKs never count.
type DirTotals struct {
	DataSegments  uint64 `json:"data_segments"`
	Retransmitted uint64 `json:"retransmitted"`
	Timeouts      uint64 `json:"timeouts"`
	OutOfOrder    uint64 `json:"out_of_order"`
	// Source says how the last interval measured them: "measured" (the
	// datapath's passive count on a via: netstack leg; the host capture's
	// on a via: host leg, or without it the kernel's own sender count on
	// its to_target), "partial" (the host capture lost packets in the
	// interval: the counts may miss some), "estimate" (a via: host leg's
	// from_target without the capture: the kernel's receive-side TCP_INFO
	// counters give data segments and out-of-order arrivals but no
	// retransmission count, so retransmitted and timeouts read 0 and mean
	// unknown) or "none".
	Source string `json:"source"`
	// Why says where the counts come from and why that source.
	Why string `json:"why,omitempty"`
	// Signal says what found the losses of the last measured interval:
	// "sequence" (a segment below the highest sequence number seen) or
	// "sequence+ip_id" (also the gaps in the target's IPv4 IP IDs, each
	// loss counted once; docs/semantics.md). Empty until measured.
	Signal string `json:"signal,omitempty"`
}

// Explanation is how one sampling interval's measurements became a target's
// effective weight (policy.Explanation on the wire). Ratios are in tenths of
// a percent, fractions in percent, rates in Kbit/s.
type Explanation struct {
	Interval       time.Duration `json:"interval"`
	SegmentsSent   uint64        `json:"segments_sent"`
	Retransmits    uint64        `json:"retransmits"`
	Timeouts       uint64        `json:"timeouts"`
	ActiveConns    int64         `json:"active_conns"`
	MaxConns       int64         `json:"max_conns"`
	ThroughputKbps int64         `json:"throughput_kbps"`

	LossRatio       int  `json:"loss_ratio"`
	TimeoutRatio    int  `json:"timeout_ratio"`
	LossFraction    int  `json:"loss_fraction"`
	TimeoutFraction int  `json:"timeout_fraction"`
	Held            bool `json:"held"` // the noise guard kept the previous loss and timeout fractions
	// MinSegments is the noise guard; PendingSegments the segments carried
	// to the next interval while held (fewer than MinSegments so far).
	MinSegments     int    `json:"min_segments"`
	PendingSegments uint64 `json:"pending_segments"`
	// TimeoutsUnknown: some connections could not count their RTO expiries
	// (a host leg on a kernel before 6.7); Timeouts is a lower bound and
	// the timeout fraction is the last judged one, not 0 %.
	TimeoutsUnknown bool `json:"timeouts_unknown,omitempty"`
	Constrained     bool `json:"constrained"`      // active connections reached 90 % of maxConnections
	DefaultFraction int  `json:"default_fraction"` // loss + timeout + error, capped at 100

	// The error part (http services, monitor.errorRatioAndWeightFr): the
	// interval's responses, their 5xx, the requests that failed before a
	// response, the ratio (tenths of a percent) and its fraction; held
	// below MinResponses responses, PendingResponses carried.
	Responses        uint64 `json:"responses,omitempty"`
	ServerErrors     uint64 `json:"server_errors,omitempty"`
	FailedRequests   uint64 `json:"failed_requests,omitempty"`
	ErrorRatio       int    `json:"error_ratio"`
	ErrorFraction    int    `json:"error_fraction"`
	ErrorHeld        bool   `json:"error_held,omitempty"`
	MinResponses     int    `json:"min_responses,omitempty"`
	PendingResponses uint64 `json:"pending_responses,omitempty"`

	Action          string `json:"action,omitempty"` // the policy action with the largest fraction
	ActionConns     int64  `json:"action_conns"`
	ActionMaxConns  int64  `json:"action_max_conns"`
	ActionKbps      int64  `json:"action_kbps"`
	PerConnKbps     int64  `json:"per_conn_kbps"`
	MinRateKbps     int64  `json:"min_rate_kbps"`
	MeanRateKbps    int64  `json:"mean_rate_kbps"`
	ConnFraction    int    `json:"conn_fraction"`
	MinRateFraction int    `json:"min_rate_fraction"`
	ActionFraction  int    `json:"action_fraction"`

	// Levels holds one service level per policy action with connections to
	// the target: its new connections are balanced on its weight.
	Levels []ExplanationLevel `json:"action_levels,omitempty"`

	Fraction      int    `json:"fraction"` // the largest of the levels'
	Winner        string `json:"winner"`   // which part set Fraction: "loss", "maxconn", "minrate", …
	BaseWeight    int    `json:"base_weight"`
	Weight        int    `json:"weight"`         // at Fraction
	DefaultWeight int    `json:"default_weight"` // at DefaultFraction: connections under no action
}

// ExplanationLevel is one policy action's service level at a target
// (policy.Level on the wire).
type ExplanationLevel struct {
	Action          string `json:"action"`
	Conns           int64  `json:"conns"`
	ConnFraction    int    `json:"conn_fraction"`
	MinRateFraction int    `json:"min_rate_fraction"`
	Fraction        int    `json:"fraction"` // max(conn, minrate, default)
	Weight          int    `json:"weight"`
}

// Refusal counts the connections one limit refused. Level is a QoS level
// ("instance", "class", "virtual server") with Limit "maxConnections",
// "maxBandwidth" or "burst"; level "balancer" with limit "targets" when no
// target could serve; level "instance" with limit "draining" while weir
// drains.
type Refusal struct {
	Level string `json:"level"`
	Limit string `json:"limit"`
	Count uint64 `json:"count"`
}

// Datapath is the packet engine's counters.
type Datapath struct {
	// Dropped counts client packets dropped as malformed before the stack,
	// one entry per reason in a fixed order.
	Dropped         []Drop `json:"dropped"`
	EgressMalformed uint64 `json:"egress_malformed"` // packets toward clients the parser rejected (passed on unchanged)
	Fragments       uint64 `json:"fragments"`        // non-first fragments, passed on unclassified
	Marked          uint64 `json:"marked"`           // packets whose ToS a policy action rewrote
	// Uncached counts packets classified without a flow entry because the
	// flow table was full.
	Uncached uint64    `json:"uncached"`
	Flows    FlowTable `json:"flows"`
}

// Drop is one drop reason's count.
type Drop struct {
	Reason string `json:"reason"`
	Count  uint64 `json:"count"`
}

// FlowTable is the datapath flow table's state.
type FlowTable struct {
	Live     int    `json:"live"`     // flows now, idle ones not yet swept included
	Inserted uint64 `json:"inserted"` // flows created
	Replaced uint64 `json:"replaced"` // flow decisions redone after a configuration swap
	Expired  uint64 `json:"expired"`  // flows removed after their idle timeout (half-open ones: timeouts.handshake)
	Refused  uint64 `json:"refused"`  // flow creations refused: the shard was full of confirmed flows
	// HalfOpen is the live TCP flows whose client has not yet sent its
	// handshake ACK (they expire within timeouts.handshake); Evicted
	// counts half-open flows removed to make room in a full shard.
	HalfOpen int    `json:"half_open"`
	Evicted  uint64 `json:"evicted"`
}

// Stack is the userspace TCP/IP stack's counters.
type Stack struct {
	TCPSegmentsSent uint64 `json:"tcp_segments_sent"` // retransmissions included
	TCPRetransmits  uint64 `json:"tcp_retransmits"`
	TCPTimeouts     uint64 `json:"tcp_timeouts"` // retransmission timeouts (RTO expiries)
	TCPResetsSent   uint64 `json:"tcp_resets_sent"`
	// SYNsDroppedInFlight counts SYNs dropped for want of room: a VIP's
	// listener with a full accept queue, or, for services without
	// listeners, the in-flight bounds (per VIP, and 1024 in all).
	SYNsDroppedInFlight  uint64 `json:"syns_dropped_in_flight"`
	UDPNoSocket          uint64 `json:"udp_no_socket"`          // UDP datagrams to no socket (answered with ICMP port unreachable)
	ICMPUnreachablesSent uint64 `json:"icmp_unreachables_sent"` // ICMPv4 and ICMPv6 destination-unreachable messages
	IPMalformed          uint64 `json:"ip_malformed"`           // IP packets the stack dropped as malformed
	TCPChecksumErrors    uint64 `json:"tcp_checksum_errors"`    // TCP segments dropped for a bad checksum
	IPFragmentsRefused   uint64 `json:"ip_fragments_refused"`   // fragments reassembly refused (overlapping, conflicting, past 64 KiB)
}

// Forwarder is the TCP forwarder's counters: what happened to SYNs and
// connections before and after admission.
type Forwarder struct {
	Accepted          uint64 `json:"accepted"`            // connections spliced to a target
	Pending           int64  `json:"pending"`             // connections between SYN and splice now
	NoService         uint64 `json:"no_service"`          // SYNs to an address:port that is no virtual server (RST)
	RefusedClosed     uint64 `json:"refused_closed"`      // SYNs while weir shuts down (RST)
	HandshakeTimedOut uint64 `json:"handshake_timed_out"` // client handshakes aborted by the handshake timeout
	HandshakeFailed   uint64 `json:"handshake_failed"`    // client handshakes that failed otherwise
	IdleClosed        uint64 `json:"idle_closed"`         // connections closed by the idle timeout
	TimeWaitReopened  uint64 `json:"time_wait_reopened"`  // SYNs that ended a TIME_WAIT and opened a new connection
	CookieReplays     uint64 `json:"cookie_replays"`      // late segments of ended connections a listener took for a SYN cookie, aborted
	Aborted           uint64 `json:"aborted"`             // connections, pending or spliced, that weir's shutdown ended
	// NoSession counts admitted SYNs the appliance returned no session for,
	// refused with RST: a weir bug.
	NoSession uint64 `json:"no_session"`
	// SYN cookies: sent when a VIP's backlog of half-open handshakes is
	// full, valid when a client completed a handshake from one, invalid
	// for an ACK that carried none.
	SYNCookiesSent    uint64 `json:"syn_cookies_sent"`
	SYNCookiesValid   uint64 `json:"syn_cookies_valid"`
	SYNCookiesInvalid uint64 `json:"syn_cookies_invalid"`
	Listeners         int    `json:"listeners"`        // VIP and port pairs with a listener now
	TargetTimedOut    uint64 `json:"target_timed_out"` // targets silent past the first-byte timeout (marked down)
	Panics            uint64 `json:"panics"`           // panics recovered in connection goroutines
	// ListenDropped counts, by reason, segments past the SYN that a VIP's
	// listener dropped (each costs its client a retransmission timeout):
	// segment_queue (the listener's queue refused it), accept_queue (a
	// cookie ACK, with its data, while the accept queue was full), failed
	// (the connection could not be made).
	ListenDropped []Drop `json:"listen_dropped,omitempty"`
	// SNIRouted counts tls connections routed by their ClientHello's
	// server name; SNIRefused, by reason, those reset before admission:
	// not-tls, malformed, oversized, timeout (timeouts.handshake), eof
	// (closed before the hello was complete), error, no-match (no tls
	// service of the VIP and port answers the name, and none is default).
	SNIRouted  uint64 `json:"sni_routed"`
	SNIRefused []Drop `json:"sni_refused,omitempty"`
	// ProxyRefused counts, by reason, connections to a service with
	// acceptProxyProtocol refused for their PROXY-protocol header (RST, or
	// 400 for http): untrusted (from outside trustedProxies), missing,
	// malformed, timeout (none within timeouts.handshake), error.
	ProxyRefused []Drop `json:"proxy_protocol_refused,omitempty"`
	// http services: request heads parsed; refused with the 503 page;
	// refused before admission (408 head too slow, 431 head too big, 400
	// malformed or Content-Length with Transfer-Encoding); sent again on a
	// fresh target connection; cut by a failing target (502).
	HTTPRequests      uint64 `json:"http_requests"`
	HTTPRefused       uint64 `json:"http_refused"`
	HTTPHeaderTimeout uint64 `json:"http_header_timeout"`
	HTTPHeaderTooBig  uint64 `json:"http_header_too_big"`
	HTTPBadRequest    uint64 `json:"http_bad_request"`
	HTTPRetried       uint64 `json:"http_retried"`
	HTTPBadGateway    uint64 `json:"http_bad_gateway"`
	HTTPBodyTimeout   uint64 `json:"http_body_timeout"`
	HTTPUndelivered   uint64 `json:"http_undelivered"`  // of HTTPBadGateway: the target never acknowledged the whole request
	HTTPClients       int64  `json:"http_clients"`      // http client connections open now
	TargetConns       int64  `json:"target_conns"`      // http target connections open now
	TargetConnsIdle   int    `json:"target_conns_idle"` // of those, pooled
}

// NIC is one interface of the stack and the transport below it.
type NIC struct {
	Name      string `json:"name"`
	RxPackets uint64 `json:"rx_packets"` // handed to the stack
	RxBytes   uint64 `json:"rx_bytes"`
	TxPackets uint64 `json:"tx_packets"` // written to the transport
	TxBytes   uint64 `json:"tx_bytes"`
	// RxCoalesced counts read pure ACKs not handed to the stack because a
	// later ACK of the same flow in the same read batch superseded them.
	RxCoalesced uint64 `json:"rx_coalesced"`
	// Dropped counts packets the NIC dropped: "malformed" (read, no IP
	// version), "detached" (read before the stack attached), "queue_full"
	// (egress queue full), "too_big" (egress over the MTU), "closed" (egress
	// after close).
	Dropped []Drop `json:"dropped"`
	// Errors counts failed transport calls: "read", "write", "write_short"
	// (packets a write did not take).
	Errors []Drop `json:"errors"`
	// Device is the transport's own counters, when it keeps any (a TUN, a
	// memory pair).
	Device *Device `json:"device,omitempty"`
}

// Device is a transport's own drop counters.
type Device struct {
	DroppedFull   uint64 `json:"dropped_full"`    // dropped because a queue was full
	DroppedTooBig uint64 `json:"dropped_too_big"` // dropped because larger than the MTU or buffer
	// WriteErrors counts packets a TUN queue's kernel refused on write (a
	// malformed header); 0 for other transports.
	WriteErrors uint64 `json:"write_errors"`
}

// TUN is the front TUN interface's link counters as the kernel keeps them,
// every queue together. "To weir" is the kernel's transmit side (packets
// routed into the TUN, toward weir's reader), "from weir" its receive side
// (packets weir wrote).
type TUN struct {
	Name string `json:"name"`
	// Offload is set when the TUN moves TCP super-packets of up to 64 KiB
	// with virtio-net headers (weir run --offload on, or auto where the
	// kernel allows it); clear, it moves one packet per read.
	Offload bool `json:"offload"`
	// ToWeirDropped counts packets the kernel dropped before weir read
	// them: the TUN's queue was full because weir read too slowly.
	ToWeirDropped uint64 `json:"to_weir_dropped"`
	ToWeirErrors  uint64 `json:"to_weir_errors"`
	// FromWeirDropped and FromWeirErrors count packets weir wrote that the
	// kernel dropped or refused (no route back, a bad header).
	FromWeirDropped uint64 `json:"from_weir_dropped"`
	FromWeirErrors  uint64 `json:"from_weir_errors"`
}

// Control is what the control plane itself dropped.
type Control struct {
	// DroppedLogLines counts log lines lost because the log writer could
	// not keep up.
	DroppedLogLines uint64 `json:"dropped_log_lines"`
	// DroppedEvents counts admission events (limit crossings) lost because
	// the control loop did not drain them in time.
	DroppedEvents uint64 `json:"dropped_events"`
}

// Connection is one open connection as /connections lists it: both legs,
// measured.
type Connection struct {
	ID      uint64    `json:"id"`
	Client  string    `json:"client"` // address:port
	VIP     string    `json:"vip"`    // address:port
	Service string    `json:"service"`
	Target  string    `json:"target,omitempty"` // "" before a target leg opened
	Action  string    `json:"action,omitempty"` // policy action, "" for none
	Start   time.Time `json:"start"`
	// ClientLeg is weir ⇄ client, TargetLeg weir ⇄ target.
	ClientLeg Leg `json:"client_leg"`
	TargetLeg Leg `json:"target_leg"`
	// Throughput is bytes per second, both directions, since the last
	// sampling interval (or since Start).
	Throughput float64 `json:"throughput"`
}

// Leg is one TCP leg's counters, as weir's end of it sees them.
type Leg struct {
	SegmentsSent     uint64 `json:"segments_sent"`
	SegmentsReceived uint64 `json:"segments_received"`
	Retransmits      uint64 `json:"retransmits"`      // segments retransmitted, for any reason
	FastRetransmits  uint64 `json:"fast_retransmits"` // segments retransmitted in fast recovery
	Timeouts         uint64 `json:"timeouts"`         // retransmission timeouts (RTO expiries)
	// TimeoutsKnown is false where the source does not count RTO expiries
	// (a host socket on a kernel older than 6.7); Timeouts is then 0.
	TimeoutsKnown bool          `json:"timeouts_known"`
	RTT           time.Duration `json:"rtt"`     // smoothed round-trip time
	RTTVar        time.Duration `json:"rtt_var"` // round-trip time variation
	BytesSent     uint64        `json:"bytes_sent"`
	BytesReceived uint64        `json:"bytes_received"`
}

// Cluster is this instance's view of the instances that share their
// enforced connection limits through Redis.
type Cluster struct {
	Name     string `json:"name"`
	Instance string `json:"instance"` // this instance's id
	Redis    string `json:"redis"`    // the server (a URL's password hidden)
	// Reachable: the last lease renewal succeeded.
	Reachable bool `json:"redis_reachable"`
	// Mode is "shared" (leases from Redis), "starting", or the fallback in
	// force while Redis is unreachable: "localShare", "failOpen" or
	// "failClosed".
	Mode      string `json:"mode"`
	LastError string `json:"last_error,omitempty"`
	Outages   uint64 `json:"redis_outages"` // times Redis became unreachable
	Renewals  uint64 `json:"renewals"`      // lease renewals sent (Redis round trips)
	// Members are the live instances as the last renewal saw them.
	Members []ClusterMember `json:"members"`
	// Levels are the enforced connection limits shared cluster-wide, then
	// the targets' maxConnections.
	Levels []ClusterLevel `json:"levels"`
	// Bandwidth lists the levels with a maxBandwidth, judged on the
	// cluster's rate. BandwidthRounds counts the round trips that shared
	// it, BandwidthFallbacks those that took the fallback.
	Bandwidth []ClusterBandwidth `json:"bandwidth"`
	// Logged lists the levels whose maxConnections is only logged: not
	// leased, but their log line counts the cluster's connections.
	Logged             []ClusterLogged `json:"logged_connections"`
	BandwidthRounds    uint64          `json:"bandwidth_rounds"`
	BandwidthFallbacks uint64          `json:"bandwidth_fallbacks"`
	// SampleRounds counts the exchanges of the targets' samples (one per
	// sampling interval), SampleFallbacks those that failed (this instance
	// then judged its own samples), SampleMembers the members summed in
	// the last one that worked.
	SampleRounds    uint64 `json:"sample_rounds"`
	SampleFallbacks uint64 `json:"sample_fallbacks"`
	SampleMembers   int    `json:"sample_members"`
	SampleError     string `json:"sample_error,omitempty"`
	// Clients is the cluster-wide per-client connection counts' traffic
	// with Redis.
	Clients ClusterClients `json:"clients"`
}

// ClusterClients counts the per-client connections judged cluster-wide:
// Admitted and Refused by Redis's count, Fallbacks judged without it
// (Redis down, an error or no answer within borrowTimeout: onRedisDown
// applies), Errors the failed round trips, Writes the batched records of
// released counts, Pending the counts not yet recorded.
type ClusterClients struct {
	Admitted  uint64 `json:"admitted"`
	Refused   uint64 `json:"refused"`
	Fallbacks uint64 `json:"fallbacks"`
	Errors    uint64 `json:"errors"`
	Writes    uint64 `json:"writes"`
	Pending   int    `json:"pending"`
}

// ClusterLogged is one level whose maxConnections is only logged: its
// open connections here and cluster-wide as last shared.
type ClusterLogged struct {
	Level   string `json:"level"`
	Name    string `json:"name"`
	Local   int64  `json:"local"`
	Cluster int64  `json:"cluster_wide"`
}

// ClusterBandwidth is one level's bandwidth, here and cluster-wide, in
// bytes per second over the metric window.
type ClusterBandwidth struct {
	Level    string `json:"level"`
	Name     string `json:"name"`
	Max      int64  `json:"max_bandwidth"`
	Enforced bool   `json:"enforced"`
	Local    int64  `json:"local"`
	// Cluster is Local plus the other members' rates as last read (or as
	// the fallback supposes while Redis is unreachable).
	Cluster int64 `json:"cluster_wide"`
}

// ClusterMember is one live instance.
type ClusterMember struct {
	ID      string    `json:"id"`
	Started time.Time `json:"started"`
	// SeenSeconds is how long ago it last renewed its membership.
	SeenSeconds float64 `json:"seen_seconds_ago"`
}

// ClusterLevel is one enforced level's figures, here and cluster-wide, or
// one target's maxConnections (Level "target").
type ClusterLevel struct {
	Level string `json:"level"` // "instance", "class", "virtual server" or "target"
	Name  string `json:"name"`
	// Service is a target's virtual server; empty for a level.
	Service string `json:"service,omitempty"`
	Limit   int64  `json:"max_connections"` // cluster-wide
	// Share is the slots this instance holds: the connections it may open.
	Share int64 `json:"share"`
	Open  int64 `json:"open"` // open here
	// Held is the sum of every instance's slots at the last renewal: at
	// least the cluster's open connections, at most Limit.
	Held int64 `json:"held_cluster_wide"`
	// Refused counts connections refused here because the share was full.
	Refused uint64 `json:"refused_by_share"`
}
