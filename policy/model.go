package policy

//go:generate go run golang.org/x/tools/cmd/stringer@v0.52.0 -type=ByteCount,ServiceProto,Role,DialVia,Algorithm,RedisDown -linecomment -output=model_string.go
import (
	"errors"
	"fmt"
	"net/netip"
	"net/textproto"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Defaults applied by Compile where a field is zero. They are the values of the
// seeds: Sun's 30 s metric window and 100 ms recompute, the z/OS Policy Agent's
// 60 s sampling interval and thresholds, the WebSphere plug-in's 60 s retry.
const (
	DefaultMetricInterval    = 30 * time.Second
	DefaultRecomputeInterval = 100 * time.Millisecond
	DefaultSamplingInterval  = 60 * time.Second
	DefaultRetryInterval     = 60 * time.Second
	DefaultMaxAttempts       = 3
	// MaxAttemptsLimit is the most targets one connection may try: the
	// bound Compile enforces on BalancerSettings.MaxAttempts and the size of
	// the balancer's per-connection tried-set (balancer.MaxTried), which is
	// the one place the attempts are counted.
	MaxAttemptsLimit        = 16
	DefaultLossThreshold    = 20  // tenths of a percent: 2 %
	DefaultLossStep         = 25  // percent
	DefaultLossMax          = 95  // percent
	DefaultTimeoutThreshold = 50  // tenths of a percent: 5 %
	DefaultTimeoutStep      = 50  // percent
	DefaultTimeoutMax       = 100 // percent
	// DefaultMinSegments is Monitor.MinSegments when unset.
	DefaultMinSegments = 100
	// DefaultErrorMax is Monitor.ErrorMax when unset (percent), and
	// DefaultMinResponses Monitor.MinResponses.
	DefaultErrorMax     = 100
	DefaultMinResponses = 20
)

// DefaultMaxConnLevels are MaxConnWeightFr 50 65 80: the percentages of an
// action's connection limit at which its fraction becomes 50, 85 and 100 %.
var DefaultMaxConnLevels = [3]int{50, 65, 80}

// Config is the whole policy: one instance, its classes, virtual servers,
// targets, policy rules and actions, the performance monitor and the balancer
// settings. It is built once (by policy/config or by hand in tests), passed
// through Compile, and never modified afterwards: a reload builds a new Config
// and swaps it whole.
type Config struct {
	Instance Instance
	Classes  []*Class         // in file order
	Services []*VirtualServer // in file order
	Actions  []*Action        // in file order
	Rules    []*Rule          // in priority order: the first match wins
	Monitor  Monitor
	Balancer BalancerSettings
	// Hostname is the host's name, an input from the control plane (the
	// config loader sets it): the default of Cluster.Instance. policy
	// itself asks the system nothing.
	Hostname string
	// NoServices says the file defines no service on purpose (the YAML key
	// `noServices: true`). A file-triggered reload refuses a config without
	// services unless it is set, so that a file caught empty or half-written
	// never takes every VIP down.
	NoServices bool
	// Cluster, when not nil, shares the enforced connection limits with the
	// other instances of the same cluster (see Cluster); nil: this instance
	// alone.
	Cluster *Cluster

	// Built by Compile.
	compiled  bool
	byVIP     map[netip.Addr][]*VirtualServer
	targetIdx map[*Target]int // see TargetIndex
}

// Instance is the global server instance: the top of the limit hierarchy.
type Instance struct {
	Name   string // default "weir"
	Limits Limits
	// ClientLimits are every client's own limits across the instance (see
	// clients.go); zero: none.
	ClientLimits ClientLimits

	// MetricInterval is the sliding window over which bandwidth is averaged;
	// zero means DefaultMetricInterval (30 s).
	MetricInterval time.Duration
	// RecomputeInterval is how often bandwidth is recomputed; zero means
	// DefaultRecomputeInterval (100 ms). It must divide MetricInterval.
	RecomputeInterval time.Duration

	// Timeouts are every virtual server's defaults; Compile fills each zero
	// field with its Default… constant.
	Timeouts Timeouts
	// BandwidthBytes chooses what the bandwidth limits count: the TCP
	// payload of admitted connections (CountPayload, the zero value, what
	// the Sun seed counts: each byte once, a retransmission's payload not
	// again; datapath/appspace.go) or every byte on the wire of those
	// connections, headers and resends included (CountWire). Traffic of
	// refused connections is never counted either way.
	BandwidthBytes ByteCount
}

// ByteCount chooses which bytes the bandwidth limits count.
type ByteCount uint8

const (
	// CountPayload counts TCP payload bytes (application bytes).
	CountPayload ByteCount = iota // payload
	// CountWire counts whole IP packets, headers included.
	CountWire // wire
)

// ParseByteCount parses a ByteCount's String form.
func ParseByteCount(s string) (ByteCount, error) {
	for b := CountPayload; b <= CountWire; b++ {
		if b.String() == s {
			return b, nil
		}
	}
	return 0, fmt.Errorf("unknown bandwidthBytes %q (want payload or wire)", s)
}

// Defaults of Timeouts, filled in by Compile.
const (
	DefaultHandshakeTimeout   = 5 * time.Second  // client handshake, SYN-ACK to final ACK
	DefaultConnectTimeout     = 3 * time.Second  // one dial to a target
	DefaultFirstByteTimeout   = 30 * time.Second // target's first byte after the client's first
	DefaultIdleTimeout        = 5 * time.Minute  // no byte either way
	DefaultRequestReadTimeout = 2 * time.Second  // reading a refused HTTP request's head
	DefaultInFlightPerVIP     = 1024             // half-open handshakes per VIP and port, and its accept queue
)

// Timeouts bound the phases of one connection, and the half-open handshakes
// one VIP may hold. In Instance.Timeouts a zero field means its Default…
// constant; in a VirtualServer's, the instance's value. After Compile no
// field is zero except FirstByte and Idle turned off (negative in the
// model, "off" in the config: Compile keeps them negative).
type Timeouts struct {
	// Handshake aborts a client handshake not completed in time; for a
	// tls service it also bounds reading the ClientHello after it.
	Handshake time.Duration
	// Connect bounds one dial to a target; a dial that times out counts as
	// a failed target (down for the balancer's retry interval).
	Connect time.Duration
	// FirstByte bounds the wait for the target's first byte once it has
	// the request: an http request's head and whole body, a tcp
	// connection's first byte from the client. A target that stays silent
	// counts as failed and the client gets the 503 page (http) or RST
	// (tcp). Negative: off.
	FirstByte time.Duration
	// Idle closes a connection with no byte in either direction for this
	// long. Negative: never.
	Idle time.Duration
	// RequestRead bounds reading an HTTP request head before a 503 page.
	RequestRead time.Duration
	// InFlightPerVIP is the backlog of one VIP and port's listener, as
	// listen(2)'s: it bounds the half-open handshakes (beyond it, SYN
	// cookies answer and hold no state) and the established connections
	// the accept loop has not taken yet (beyond it, gVisor drops the ACK
	// that completes a handshake: a burst of more connections completing
	// at once loses them). gVisor sizes both from the one number.
	InFlightPerVIP int
}

// resolve fills t's zero fields from def and reports the negative ones that
// may not be (all but FirstByte and Idle).
func (t *Timeouts) resolve(def Timeouts, bad func(string, ...any), where string) {
	d := func(p *time.Duration, v time.Duration, name string, offOK bool) {
		if *p == 0 {
			*p = v
		}
		if *p < 0 && !offOK {
			bad("%s timeouts: %s %v is negative", where, name, *p)
		}
	}
	d(&t.Handshake, def.Handshake, "handshake", false)
	d(&t.Connect, def.Connect, "connect", false)
	d(&t.FirstByte, def.FirstByte, "firstByte", true)
	d(&t.Idle, def.Idle, "idle", true)
	d(&t.RequestRead, def.RequestRead, "requestRead", false)
	if t.InFlightPerVIP == 0 {
		t.InFlightPerVIP = def.InFlightPerVIP
	}
	if t.InFlightPerVIP < 1 || t.InFlightPerVIP > MaxInFlightPerVIP {
		bad("%s timeouts: inFlightPerVIP %d is out of range 1..%d", where, t.InFlightPerVIP, MaxInFlightPerVIP)
	}
}

// MaxInFlightPerVIP bounds Timeouts.InFlightPerVIP (a listener's SYN
// backlog).
const MaxInFlightPerVIP = 65535

// Class is a virtual-server class (Sun's term): a named group of virtual
// servers sharing aggregate limits. A class may sit inside a parent class;
// the chain must not loop.
type Class struct {
	Name   string
	Parent *Class // nil: directly under the instance
	Limits Limits
}

// Limits are the Sun-style QoS limits of one level (instance, class or
// virtual server). A zero field means "no limit" at that level. Each level's
// limits apply to that level's aggregate (a class's bandwidth is the sum of its
// virtual servers'), and admission checks the virtual server first, then its
// class chain, then the instance: a lower level's limit is the one that trips
// first when it is the tighter one.
type Limits struct {
	// MaxBandwidth is in bytes per second, averaged over the metric interval;
	// 0 means no limit.
	MaxBandwidth int64
	// EnforceBandwidth refuses new connections while over MaxBandwidth;
	// when false the excess is only logged.
	EnforceBandwidth bool
	// MaxConnections is the number of concurrent connections; ≤ 0 means no
	// limit.
	MaxConnections int64
	// EnforceConnections refuses new connections at MaxConnections; when
	// false the excess is only logged.
	EnforceConnections bool
	// BurstBytes, when > 0, adds a token-bucket cap on top of the window
	// average: a bucket of BurstBytes refilled at MaxBandwidth. It closes the
	// seed's hole where an idle window lets a client use 30× the limit in one
	// second. 0 (the default) turns it off.
	BurstBytes int64
	// Queue, with an enforced MaxConnections, lets up to Queue
	// connections (tcp) or requests (http) over the limit wait, first in
	// first out, for a slot instead of being refused at once; a freed slot
	// goes to the queue before new arrivals. 0 (the default): refused at
	// once.
	Queue int64
	// QueueTimeout bounds one wait in the queue; then the RST or the 503
	// page. 0 means DefaultQueueTimeout (2 s).
	QueueTimeout time.Duration
}

// Any reports whether any limit is set.
func (l Limits) Any() bool { return l.MaxBandwidth > 0 || l.MaxConnections > 0 }

// ServiceProto is what a virtual server speaks, which decides how a refusal
// looks: TCP refuses with RST, HTTP with a 503 page naming the limit. TLS
// is TCP whose service is chosen by the server name of the client's
// ClientHello among the tls services of one VIP and port (see sni.go); it
// refuses with RST. UDP drops the new session's datagram (counted, no
// ICMP).
type ServiceProto uint8

const (
	ProtoTCP  ServiceProto = iota // tcp
	ProtoHTTP                     // http
	ProtoTLS                      // tls
	// ProtoUDP is a datagram service: a session per client address and
	// port, relayed datagram by datagram (see UDPOptions).
	ProtoUDP // udp
)

// ParseServiceProto parses "tcp", "http", "tls" or "udp".
func ParseServiceProto(s string) (ServiceProto, error) {
	switch s {
	case "tcp":
		return ProtoTCP, nil
	case "http":
		return ProtoHTTP, nil
	case "tls":
		return ProtoTLS, nil
	case "udp":
		return ProtoUDP, nil
	}
	return 0, fmt.Errorf("unknown protocol %q (want tcp, http, tls or udp)", s)
}

// PortRange is an inclusive range of ports. The zero value {0, 0} matches any
// port in a rule; a virtual server needs Lo ≥ 1.
type PortRange struct{ Lo, Hi uint16 }

// Any reports whether r is the wildcard range.
func (r PortRange) Any() bool { return r.Lo == 0 && r.Hi == 0 }

// Contains reports whether p is in r; the wildcard contains every port.
func (r PortRange) Contains(p uint16) bool { return r.Any() || (p >= r.Lo && p <= r.Hi) }

// Overlaps reports whether r and o share a port.
func (r PortRange) Overlaps(o PortRange) bool {
	if r.Any() || o.Any() {
		return true
	}
	return r.Lo <= o.Hi && o.Lo <= r.Hi
}

func (r PortRange) String() string {
	if r.Any() {
		return "any"
	}
	if r.Lo == r.Hi {
		return strconv.Itoa(int(r.Lo))
	}
	return strconv.Itoa(int(r.Lo)) + "-" + strconv.Itoa(int(r.Hi))
}

// VirtualServer is a service weir answers for: one or more VIPs (IPv4 and/or
// IPv6), a port or port range, a protocol, its class, its own limits and its
// targets.
type VirtualServer struct {
	Name   string
	Class  *Class // nil: directly under the instance
	VIPs   []netip.Addr
	Ports  PortRange
	Proto  ServiceProto
	Limits Limits
	// ClientLimits are each client's own limits at this virtual server
	// (for http: requests in flight); zero: none.
	ClientLimits ClientLimits
	// Timeouts of this virtual server's connections; zero fields take the
	// instance's (see Timeouts).
	Timeouts Timeouts
	// HTTP tunes request handling; used only when Proto is ProtoHTTP.
	HTTP HTTPOptions
	// SNI are the server names a ProtoTLS service answers for, among the
	// tls services sharing its VIPs and ports: host names ("www.example.com")
	// and wildcards of one label ("*.example.com"), compared without case
	// and trailing dot (Compile lower-cases them). SNIDefault makes it the
	// service of a ClientHello no other one's names match, or without a
	// server name. See sni.go.
	SNI        []string
	SNIDefault bool
	// UDP tunes the sessions of a udp service; used only when Proto is
	// ProtoUDP.
	UDP UDPOptions
	// Targets in configured order: primaries first in the order given, then
	// backups in the order they are to be tried.
	Targets []*Target
	// HashBy is the service's own Maglev hash key, nil for the balancer's.
	// After Compile it is never nil; a tcp service given header or cookie
	// by the balancer hashes by client (it has no requests).
	HashBy *HashBy
	// Health is the service's own health check, nil for the balancer's.
	// After Compile it is never nil: the check its targets get (see
	// Config.resolveHealth).
	Health *HealthCheck
	// AcceptProxy is the PROXY-protocol header weir reads first on every
	// connection to this virtual server (ProxyNone: none). The client
	// address it carries is the client's for everything after: the rules,
	// the limits, the balancer's hash, the access log, X-Forwarded-For and
	// Forwarded, and the header weir sends to its targets.
	AcceptProxy ProxyProtocol
	// TrustedProxies are the addresses a header is accepted from; a
	// connection from any other is refused. Compile requires at least one
	// when AcceptProxy is set.
	TrustedProxies []netip.Prefix
}

// ProxyProtocol is a PROXY-protocol version (HAProxy's
// doc/proxy-protocol.txt), or, for VirtualServer.AcceptProxy, the set
// accepted. The values are those of weir/netstack/proxy/proxyproto's
// Version.
type ProxyProtocol uint8

// The PROXY-protocol settings.
const (
	ProxyNone ProxyProtocol = 0
	ProxyV1   ProxyProtocol = 1
	ProxyV2   ProxyProtocol = 2
	ProxyAny  ProxyProtocol = 3 // v1 or v2 (accepting only)
)

func (p ProxyProtocol) String() string {
	switch p {
	case ProxyNone:
		return "none"
	case ProxyV1:
		return "v1"
	case ProxyV2:
		return "v2"
	case ProxyAny:
		return "any"
	}
	return "proxyProtocol(" + strconv.Itoa(int(p)) + ")"
}

// ParseProxyProtocol parses v1 or v2, and any when any is true (what a
// service accepts).
func ParseProxyProtocol(s string, any bool) (ProxyProtocol, error) {
	switch s {
	case "v1":
		return ProxyV1, nil
	case "v2":
		return ProxyV2, nil
	case "any":
		if any {
			return ProxyAny, nil
		}
	}
	if any {
		return 0, fmt.Errorf("want v1, v2 or any, got %q", s)
	}
	return 0, fmt.Errorf("want v1 or v2, got %q", s)
}

// Role says whether a target is balanced (primary) or only tried, in order,
// when no primary can serve (backup), as the WebSphere plug-in does.
type Role uint8

const (
	RolePrimary Role = iota // primary
	RoleBackup              // backup
)

// DialVia says how weir reaches a target.
type DialVia uint8

const (
	// DialHost uses an ordinary kernel socket; stats come from TCP_INFO.
	DialHost DialVia = iota // host
	// DialNetstack dials through weir's second gVisor NIC (the back arm).
	DialNetstack // netstack
)

// DialAddr is the address a connection the client made to port
// clientPort of the virtual server goes to: Addr, or Addr's IP at
// clientPort when Addr's port is 0 (the target keeps the client's port).
func (t *Target) DialAddr(clientPort uint16) netip.AddrPort {
	if t.Addr.Port() != 0 {
		return t.Addr
	}
	return netip.AddrPortFrom(t.Addr.Addr(), clientPort)
}

// KeepsPort reports whether the target connects to the port the client
// asked for (Addr's port is 0).
func (t *Target) KeepsPort() bool { return t.Addr.Port() == 0 }

// DefaultName is a target's name when the configuration gives none: its
// address, without the port when it keeps the client's.
func (t *Target) DefaultName() string {
	if t.KeepsPort() {
		return t.Addr.Addr().String()
	}
	return t.Addr.String()
}

// Target is one backend of a virtual server.
type Target struct {
	// Name identifies the target across reloads (counters, connection counts
	// and down-state carry over by name). Default: DefaultName().
	Name string
	// Addr is where the target listens. Port 0 keeps the client's port: a
	// connection to the virtual server's port p goes to the target's port
	// p, as IPVS and HAProxy do for a service on a port range (see
	// DialAddr).
	Addr netip.AddrPort
	// Weight is the WLM weight, ≥ 0; the QoS fraction cuts it. 0 is a
	// real weight (draining: no new connections at all), so
	// Compile does not default it: the YAML parser (policy/config) writes 1
	// when the file gives none; a Target built in code has what it is given.
	Weight int
	// MaxConnections is the number of open connections through weir this
	// target may have; ≤ 0 means no limit.
	MaxConnections int64
	Role           Role
	Via            DialVia
	// ProxyProtocol makes weir write a PROXY-protocol header of this
	// version (the client's address and port, the VIP's) before any byte
	// on every connection to the target, and the address-less one (v2
	// LOCAL, v1 UNKNOWN) on its health checks; ProxyNone: no header.
	ProxyProtocol ProxyProtocol
}

// Action is a z/OS Policy Agent policy action: the service level a matching
// flow gets.
type Action struct {
	Name string
	// OutgoingTOS is the ToS byte written on every packet toward the client
	// when SetTOS is true (`OutgoingTOS 10100000` is binary: 0xA0).
	OutgoingTOS uint8
	SetTOS      bool
	// MinRate is the minimum throughput per connection in Kbit/s; 0: none.
	MinRate int64
	// MeanRate is the DiffServ mean rate in Kbit/s; 0: none.
	MeanRate int64
	// MaxConnections is the action's connection limit, the base of
	// MaxConnWeightFr; ≤ 0: none.
	MaxConnections int64
}

// Rule is a z/OS Policy Agent policy rule. It is matched against a flow as the
// server side sees it, as on z/OS where the policy governs a target's outbound
// traffic: Source is the virtual server's address and port, Destination the
// client's. So `SourcePortRange 23` selects a Telnet service on port 23.
// Zero fields match anything. Rules are tried in order and the first match
// wins.
type Rule struct {
	Name    string
	ProtoLo uint8 // IP protocol number range; 0-0 (or 0-255) matches any
	ProtoHi uint8
	SrcPort PortRange
	DstPort PortRange
	Src     netip.Prefix // invalid (zero) Prefix matches any
	Dst     netip.Prefix
	Service *VirtualServer // nil: any
	Action  *Action
}

// Match reports whether r selects the flow with IP protocol proto whose server
// side is src (the VIP and service port) and client side dst, arriving at
// service vs (may be nil).
func (r *Rule) Match(proto uint8, src, dst netip.AddrPort, vs *VirtualServer) bool {
	if !r.matchProto(proto) {
		return false
	}
	if !r.SrcPort.Contains(src.Port()) || !r.DstPort.Contains(dst.Port()) {
		return false
	}
	if r.Src.IsValid() && !r.Src.Contains(src.Addr()) {
		return false
	}
	if r.Dst.IsValid() && !r.Dst.Contains(dst.Addr()) {
		return false
	}
	return r.Service == nil || r.Service == vs
}

// matchProto reports whether the rule's protocol range holds proto.
func (r *Rule) matchProto(proto uint8) bool {
	return (r.ProtoLo == 0 && r.ProtoHi == 0) || (proto >= r.ProtoLo && proto <= r.ProtoHi)
}

// IPProtoTCP and IPProtoUDP are the IP protocol numbers virtual servers
// serve: UDP for ProtoUDP, TCP for the others.
const (
	IPProtoTCP = 6
	IPProtoUDP = 17
)

// IPProto is the IP protocol number of vs's flows: 17 for a udp service, 6
// otherwise.
func (vs *VirtualServer) IPProto() uint8 {
	if vs.Proto == ProtoUDP {
		return IPProtoUDP
	}
	return IPProtoTCP
}

// Covers reports whether r can match some connection (a udp service's
// datagram) to vs: Match
// holds for at least one flow of vs (its protocol, one of its VIPs and
// ports, any client). It is how a config is checked for services the
// monitor never sees.
func (r *Rule) Covers(vs *VirtualServer) bool {
	if r.Service != nil && r.Service != vs {
		return false
	}
	if !r.matchProto(vs.IPProto()) {
		return false
	}
	if !r.SrcPort.Overlaps(vs.Ports) {
		return false
	}
	if !r.Src.IsValid() {
		return true
	}
	for _, v := range vs.VIPs {
		if r.Src.Contains(v) || r.Src.Contains(v.Unmap()) {
			return true
		}
	}
	return false
}

// Classify returns the action of the first rule matching the flow, or nil.
// It does not allocate; callers cache the result per flow.
func (c *Config) Classify(proto uint8, src, dst netip.AddrPort, vs *VirtualServer) *Action {
	for _, r := range c.Rules {
		if r.Match(proto, src, dst, vs) {
			return r.Action
		}
	}
	return nil
}

// Monitor is PolicyPerfMonitorForSDR: how measured TCP quality cuts weights.
// Ratios are in tenths of a percent, fractions in percent, as in the seed.
type Monitor struct {
	Enabled          bool
	SamplingInterval time.Duration // default 60 s
	LossThreshold    int           // LossRatioAndWeightFr T (tenths of %), default 20
	LossStep         int           // LossRatioAndWeightFr F (%), default 25
	TimeoutThreshold int           // TimeoutRatioAndWeightFr T, default 50
	TimeoutStep      int           // TimeoutRatioAndWeightFr F, default 50
	LossMax          int           // LossMaxWeightFr (%), default 95
	TimeoutMax       int           // TimeoutMaxWeightFr (%), default 100
	MaxConnLevels    [3]int        // MaxConnWeightFr (%), default 50 65 80
	// Direction chooses which segments of a target leg the loss and
	// timeout ratios read (see direction.go); the zero value is
	// FromTarget, the seed's.
	Direction Direction
	// Scope chooses which connections feed a target's ratios; the zero
	// value is ScopePolicy, the seed's.
	Scope Scope
	// MinSegments is the noise guard: the segments a target's loss and
	// timeout ratios are judged over at least; a quieter target accumulates
	// its counts over intervals until it has that many (see Explain).
	// Zero means DefaultMinSegments (100).
	MinSegments int
	// HostCaptureOff turns the host-leg capture off (monitor.hostCapture:
	// off): a via: host leg's from_target is then TCP_INFO's estimate.
	// The zero value, on, captures the via: host legs' segments
	// (datapath/hostcap) so that both their directions are measured.
	HostCaptureOff bool
	// ErrorThreshold and ErrorStep are errorRatioAndWeightFr, the seed's
	// step rule applied to an http target's 5xx responses: each whole
	// ErrorThreshold (tenths of a percent) the ratio of 5xx responses to
	// responses in a sampling interval strictly exceeds cuts ErrorStep
	// percent, capped at ErrorMax (errorMaxWeightFr, default 100); the
	// error fraction adds to the loss and timeout fractions under the same
	// 100 % cap. Zero (the default): no error fraction.
	ErrorThreshold int
	ErrorStep      int
	ErrorMax       int
	// MinResponses is the error part's noise guard (errorMinResponses,
	// default DefaultMinResponses): a target with fewer responses in an
	// interval is held and its counts carried, as MinSegments does.
	MinResponses int
	// ErrorCountsFailures counts the requests that failed before a
	// response (first-byte timeout, connection cut) as errors too
	// (errorCountsFailures); by default only 5xx responses are.
	ErrorCountsFailures bool
}

// Algorithm selects how the balancer spreads new connections.
type Algorithm uint8

const (
	// RoundRobin is smooth weighted round robin over effective weights.
	RoundRobin Algorithm = iota // round-robin
	// LeastConn is weighted least connections.
	LeastConn // least-conn
	// Maglev is consistent hashing on the 5-tuple.
	Maglev // maglev
)

// ParseAlgorithm parses an Algorithm's String form.
func ParseAlgorithm(s string) (Algorithm, error) {
	for a := RoundRobin; a <= Maglev; a++ {
		if a.String() == s {
			return a, nil
		}
	}
	return 0, fmt.Errorf("unknown algorithm %q (want round-robin, least-conn or maglev)", s)
}

// BalancerSettings configure the distributor.
type BalancerSettings struct {
	Algorithm Algorithm
	// RetryInterval is how long a target that failed a connect stays down;
	// zero means DefaultRetryInterval (60 s, as the WebSphere plug-in).
	RetryInterval time.Duration
	// MaxAttempts bounds the targets tried for one connection, 1 to
	// MaxAttemptsLimit; zero means DefaultMaxAttempts. The balancer's
	// tried-set is its only owner: the forwarder dials whatever the
	// balancer hands out until the balancer refuses.
	MaxAttempts int
	// RefreshInterval is how often the config file is checked for changes;
	// zero turns the check off (SIGHUP still reloads).
	RefreshInterval time.Duration
	// SlowStart ramps a recovered target's weight over this window; zero: off.
	SlowStart time.Duration
	Health    HealthCheck
	// HashBy is the key Maglev hashes (algorithm maglev only); the zero
	// value is HashConnection. A service's own (VirtualServer.HashBy)
	// overrides it.
	HashBy HashBy
	// Ejection is outlier ejection (balancer.ejection); the zero value is
	// off.
	Ejection Ejection
}

// Defaults of Ejection, filled in by Compile when ConsecutiveFailures is set.
const (
	DefaultEjectionFor        = 30 * time.Second
	DefaultEjectionMaxPercent = 50
)

// Ejection is outlier ejection, Envoy's consecutive-failures detection: a
// target whose last ConsecutiveFailures connections or requests failed (a
// failed connect, a first-byte timeout, with ServerErrors an http response
// with a 5xx status) is taken out of its service's rotation for For, unless
// MaxPercent of the service's targets are ejected already. A success resets
// the count. ConsecutiveFailures zero turns it off.
type Ejection struct {
	ConsecutiveFailures int
	For                 time.Duration // default DefaultEjectionFor
	MaxPercent          int           // 1..100, default DefaultEjectionMaxPercent
	ServerErrors        bool          // 5xx responses count as failures
}

// HashKind says what a Maglev pick hashes.
type HashKind uint8

const (
	// HashConnection hashes the connection's 5-tuple: every new source
	// port may reach another target.
	HashConnection HashKind = iota
	// HashClient hashes the client's address alone: every connection of
	// a client reaches one target while the table holds.
	HashClient
	// HashHeader hashes a request header's value (http services, per
	// request); a request without it hashes the client's address.
	HashHeader
	// HashCookie hashes a request cookie's value (http services, per
	// request); a request without it hashes the client's address.
	HashCookie
)

// HashBy is a Maglev hash key: a kind and, for header and cookie, the name.
type HashBy struct {
	Kind HashKind
	Name string // the header (canonical form) or cookie name
}

func (h HashBy) String() string {
	switch h.Kind {
	case HashClient:
		return "client"
	case HashHeader:
		return "header:" + h.Name
	case HashCookie:
		return "cookie:" + h.Name
	}
	return "connection"
}

// ParseHashBy parses connection, client, header:NAME or cookie:NAME.
func ParseHashBy(s string) (HashBy, error) {
	switch s {
	case "connection":
		return HashBy{}, nil
	case "client":
		return HashBy{Kind: HashClient}, nil
	}
	kind, name, ok := strings.Cut(s, ":")
	valid := ok && name != "" && strings.IndexFunc(name, func(c rune) bool {
		return c <= ' ' || c >= 0x7f || strings.ContainsRune("()<>@,;:\\\"/[]?={}", c)
	}) < 0
	switch {
	case kind == "header" && valid:
		return HashBy{Kind: HashHeader, Name: textproto.CanonicalMIMEHeaderKey(name)}, nil
	case kind == "cookie" && valid:
		return HashBy{Kind: HashCookie, Name: name}, nil
	}
	return HashBy{}, fmt.Errorf("hashBy %q: want connection, client, header:NAME or cookie:NAME (NAME a header or cookie name)", s)
}

// HealthCheck configures active health checks; Interval zero turns them off.
// A check dials the target on a fresh connection; with no probe set the
// completed TCP handshake passes it. The probe is HTTP (an HTTP request, the
// response status judged) or, for a TCP check, Send then Expect or
// ExpectRegexp (the first bytes read within Timeout judged). A udp service's
// check is UDP (a datagram, the replies judged) and nothing else.
type HealthCheck struct {
	Interval time.Duration
	Timeout  time.Duration // default Interval/2
	Rise     int           // successes to mark up, default DefaultHealthRise
	Fall     int           // failures to mark down, default DefaultHealthFall
	// HTTP, when set, makes the check an HTTP/1.1 request; Send and Expect
	// are then unused (Compile refuses both at once).
	HTTP *HTTPCheck
	// Send is written once the connection is up (may be empty).
	Send string
	// Expect, when set, must be the first bytes the target sends.
	Expect string
	// ExpectRegexp, when set, must match within the first bytes the target
	// sends (at most HealthExpectMax). At most one of Expect and
	// ExpectRegexp is set.
	ExpectRegexp *regexp.Regexp
	// UDP, when set, makes the check one datagram and its reply (UDPCheck):
	// the probe of a udp service, which takes no other (Compile refuses it
	// on other services, in the balancer's check, and beside http or
	// send/expect).
	UDP *UDPCheck
}

// HTTPCheck is an HTTP health check's request and the statuses that pass.
type HTTPCheck struct {
	Method string // default "GET"
	Path   string // default "/"; must start with "/"
	// Host is the Host header; empty: the target's address.
	Host string
	// Status is the passing status range, default DefaultHealthStatus.
	Status StatusRange
}

// StatusRange is an inclusive range of HTTP status codes.
type StatusRange struct{ Lo, Hi int }

// DefaultHealthStatus is an HTTP check's default passing range: 200-399.
var DefaultHealthStatus = StatusRange{200, 399}

// Contains reports whether code is in r.
func (r StatusRange) Contains(code int) bool { return code >= r.Lo && code <= r.Hi }

func (r StatusRange) String() string {
	if r.Lo == r.Hi {
		return strconv.Itoa(r.Lo)
	}
	return strconv.Itoa(r.Lo) + "-" + strconv.Itoa(r.Hi)
}

// ParseStatusRange parses a status code ("200") or an inclusive range
// ("200-399") of codes 100..599, low before high.
func ParseStatusRange(s string) (StatusRange, error) {
	lo, hi, isRange := strings.Cut(strings.TrimSpace(s), "-")
	code := func(x string) (int, error) {
		x = strings.TrimSpace(x)
		n, err := strconv.Atoi(x)
		if err != nil || len(x) != 3 || n < 100 || n > 599 {
			return 0, fmt.Errorf("status range %q: %q is not a status code 100..599", s, x)
		}
		return n, nil
	}
	l, err := code(lo)
	if err != nil {
		return StatusRange{}, err
	}
	h := l
	if isRange {
		if h, err = code(hi); err != nil {
			return StatusRange{}, err
		}
	}
	if h < l {
		return StatusRange{}, fmt.Errorf("status range %q: %d is below %d", s, h, l)
	}
	return StatusRange{l, h}, nil
}

// HealthExpectMax bounds the bytes a send/expect check reads looking for
// its expectation.
const HealthExpectMax = 4096

// HasProbe reports whether the check sends anything or judges a reply.
func (h *HealthCheck) HasProbe() bool {
	return h.HTTP != nil || h.Send != "" || h.Expect != "" || h.ExpectRegexp != nil || h.UDP != nil
}

// Health-check defaults applied by Compile when Interval is set.
const (
	DefaultHealthRise = 2
	DefaultHealthFall = 3
)

// Compile fills defaults, checks the invariants every consumer relies on and
// builds the lookup indexes. After Compile the Config must not be modified.
// Parsers report errors with positions before they get here; Compile's errors
// are for configs built in code.
func Compile(c *Config) (*Config, error) {
	if c.compiled {
		return c, nil
	}
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	compileInstance(&c.Instance, bad)
	compileMonitor(&c.Monitor, bad)
	compileBalancer(&c.Balancer, bad)
	if c.Cluster != nil {
		compileCluster(c.Cluster, c.Hostname, bad)
	}
	compileClasses(c.Classes, bad)
	c.compileServices(bad)
	for _, r := range c.Rules {
		if r.Action == nil {
			bad("rule %q has no action", r.Name)
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	c.compiled = true
	return c, nil
}

// setDefault sets *p to v when it is zero.
func setDefault[T comparable](p *T, v T) {
	var zero T
	if *p == zero {
		*p = v
	}
}

// compileInstance fills the instance's defaults (name, intervals,
// timeouts) and checks them.
func compileInstance(in *Instance, bad func(string, ...any)) {
	setDefault(&in.Name, "weir")
	setDefault(&in.MetricInterval, DefaultMetricInterval)
	setDefault(&in.RecomputeInterval, DefaultRecomputeInterval)
	mi, ri := in.MetricInterval, in.RecomputeInterval
	if mi < 0 || ri < 0 || ri > mi || mi%ri != 0 {
		bad("metricInterval %v must be a positive multiple of recomputeInterval %v", mi, ri)
	}
	in.Timeouts.resolve(Timeouts{
		Handshake: DefaultHandshakeTimeout, Connect: DefaultConnectTimeout, FirstByte: DefaultFirstByteTimeout,
		Idle: DefaultIdleTimeout, RequestRead: DefaultRequestReadTimeout, InFlightPerVIP: DefaultInFlightPerVIP,
	}, bad, "instance")
	in.Limits.check(bad, "instance limits")
	in.ClientLimits.check(bad, "instance clientLimits")
}

// compileMonitor fills the performance monitor's defaults and checks them.
func compileMonitor(m *Monitor, bad func(string, ...any)) {
	setDefault(&m.SamplingInterval, DefaultSamplingInterval)
	setDefault(&m.LossThreshold, DefaultLossThreshold)
	setDefault(&m.LossStep, DefaultLossStep)
	setDefault(&m.LossMax, DefaultLossMax)
	setDefault(&m.TimeoutThreshold, DefaultTimeoutThreshold)
	setDefault(&m.TimeoutStep, DefaultTimeoutStep)
	setDefault(&m.TimeoutMax, DefaultTimeoutMax)
	setDefault(&m.MinSegments, DefaultMinSegments)
	if m.MinSegments < 0 {
		bad("monitor minSegments %d is negative", m.MinSegments)
	}
	setDefault(&m.MaxConnLevels, DefaultMaxConnLevels)
	if m.ErrorThreshold > 0 {
		setDefault(&m.ErrorMax, DefaultErrorMax)
		setDefault(&m.MinResponses, DefaultMinResponses)
	}
	if m.ErrorThreshold < 0 || m.ErrorStep < 0 || m.ErrorMax < 0 || m.MinResponses < 0 {
		bad("monitor errorRatioAndWeightFr [%d, %d], errorMaxWeightFr %d, errorMinResponses %d: none may be negative",
			m.ErrorThreshold, m.ErrorStep, m.ErrorMax, m.MinResponses)
	}
}

// compileBalancer fills the distributor's defaults, health checks
// included, and checks them.
func compileBalancer(b *BalancerSettings, bad func(string, ...any)) {
	setDefault(&b.RetryInterval, DefaultRetryInterval)
	if b.RetryInterval < 0 {
		bad("balancer retryInterval %v is negative", b.RetryInterval)
	}
	setDefault(&b.MaxAttempts, DefaultMaxAttempts)
	if b.MaxAttempts < 1 || b.MaxAttempts > MaxAttemptsLimit {
		bad("balancer maxAttempts %d is out of range 1..%d", b.MaxAttempts, MaxAttemptsLimit)
	}
	if b.SlowStart < 0 {
		bad("balancer slowStart %v is negative", b.SlowStart)
	}
	b.Health.compile(bad, "balancer")
	if b.Health.UDP != nil {
		bad("balancer health check: a udp probe belongs in a udp service's own healthCheck (the balancer's is every tcp, http and tls service's)")
	}
	if e := &b.Ejection; e.ConsecutiveFailures != 0 {
		setDefault(&e.For, DefaultEjectionFor)
		setDefault(&e.MaxPercent, DefaultEjectionMaxPercent)
		if e.ConsecutiveFailures < 0 || e.For < 0 || e.MaxPercent < 0 || e.MaxPercent > 100 {
			bad("balancer ejection consecutiveFailures %d, for %v, maxPercent %d: none may be negative, maxPercent at most 100",
				e.ConsecutiveFailures, e.For, e.MaxPercent)
		}
	}
	if b.HashBy.Kind != HashConnection && b.Algorithm != Maglev {
		bad("balancer hashBy %v needs algorithm maglev, not %v", b.HashBy, b.Algorithm)
	}
}

// compile fills a health check's defaults and checks it; where names the
// check in errors.
func (h *HealthCheck) compile(bad func(string, ...any), where string) {
	if h.Interval > 0 {
		setDefault(&h.Timeout, h.Interval/2)
		setDefault(&h.Rise, DefaultHealthRise)
		setDefault(&h.Fall, DefaultHealthFall)
		if h.Timeout < 0 || h.Rise < 0 || h.Fall < 0 {
			bad("%s health check timeout %v, rise %d, fall %d: none may be negative", where, h.Timeout, h.Rise, h.Fall)
		}
	} else if h.Interval < 0 {
		bad("%s health check interval %v is negative", where, h.Interval)
	}
	if h.Expect != "" && h.ExpectRegexp != nil {
		bad("%s health check: expect and expectRegexp both set", where)
	}
	if x := h.UDP; x != nil {
		if h.HTTP != nil || h.Send != "" || h.Expect != "" || h.ExpectRegexp != nil {
			bad("%s health check: udp and http or send/expect both set", where)
		}
		x.compile(bad, where)
	}
	if x := h.HTTP; x != nil {
		if h.Send != "" || h.Expect != "" || h.ExpectRegexp != nil {
			bad("%s health check: http and send/expect both set", where)
		}
		setDefault(&x.Method, "GET")
		setDefault(&x.Path, "/")
		setDefault(&x.Status, DefaultHealthStatus)
		if !strings.HasPrefix(x.Path, "/") || strings.ContainsAny(x.Path, " \r\n") {
			bad("%s health check: http path %q must start with / and hold no space or line break", where, x.Path)
		}
		if strings.ContainsAny(x.Method, " \r\n/:") || strings.ContainsAny(x.Host, " \r\n/") {
			bad("%s health check: http method %q or host %q holds a space, line break or slash", where, x.Method, x.Host)
		}
		if x.Status.Lo < 100 || x.Status.Hi > 599 || x.Status.Hi < x.Status.Lo {
			bad("%s health check: http status range %v is not within 100..599, low first", where, x.Status)
		}
	}
}

// resolveHashBy sets vs.HashBy: the service's own or the balancer's; it
// needs algorithm maglev unless it is connection, and header or cookie of
// the service's own need an http service.
func (c *Config) resolveHashBy(vs *VirtualServer, bad func(string, ...any)) {
	if vs.HashBy == nil {
		h := c.Balancer.HashBy
		if (h.Kind == HashHeader || h.Kind == HashCookie) && vs.Proto != ProtoHTTP {
			h = HashBy{Kind: HashClient}
		}
		vs.HashBy = &h
		return
	}
	h := *vs.HashBy
	if (h.Kind == HashHeader || h.Kind == HashCookie) && vs.Proto != ProtoHTTP {
		bad("virtual server %q: hashBy %v needs protocol http", vs.Name, h)
	}
	if h.Kind != HashConnection && c.Balancer.Algorithm != Maglev {
		bad("virtual server %q: hashBy %v needs balancer algorithm maglev, not %v", vs.Name, h, c.Balancer.Algorithm)
	}
	vs.HashBy = &h
}

// checkProxy checks the PROXY-protocol settings of vs and of its targets.
func (vs *VirtualServer) checkProxy(bad func(string, ...any)) {
	if vs.AcceptProxy > ProxyAny {
		bad("virtual server %q: acceptProxyProtocol %v", vs.Name, vs.AcceptProxy)
	}
	switch {
	case vs.AcceptProxy != ProxyNone && len(vs.TrustedProxies) == 0:
		bad("virtual server %q: acceptProxyProtocol %v needs trustedProxies (the outer load balancers' prefixes)", vs.Name, vs.AcceptProxy)
	case vs.AcceptProxy == ProxyNone && len(vs.TrustedProxies) > 0:
		bad("virtual server %q: trustedProxies without acceptProxyProtocol", vs.Name)
	}
	for i, p := range vs.TrustedProxies {
		if !p.IsValid() {
			bad("virtual server %q: trustedProxies[%d] is no prefix", vs.Name, i)
		}
		vs.TrustedProxies[i] = p.Masked()
	}
	for _, t := range vs.Targets {
		if t != nil && t.ProxyProtocol != ProxyNone && t.ProxyProtocol != ProxyV1 && t.ProxyProtocol != ProxyV2 {
			bad("virtual server %q: target %q: proxyProtocol %v (want v1 or v2)", vs.Name, t.Name, t.ProxyProtocol)
		}
	}
}

// Trusted reports whether a PROXY-protocol header from addr is accepted.
func (vs *VirtualServer) Trusted(addr netip.Addr) bool {
	addr = addr.Unmap()
	for _, p := range vs.TrustedProxies {
		if p.Contains(addr) {
			return true
		}
	}
	return false
}

// resolveHealth sets vs.Health, the check its targets get: the balancer's
// when the service has none of its own; else the service's, where a zero
// interval, timeout, rise or fall takes the balancer's and the probe
// (http, send/expect, udp) is the service's alone (none: a TCP connect).
// A udp service without a check of its own gets none (the balancer's
// speaks TCP); its own must have the udp probe, which no other service
// may have.
func (c *Config) resolveHealth(vs *VirtualServer, bad func(string, ...any)) {
	b := c.Balancer.Health
	if vs.Proto == ProtoUDP {
		if vs.Health == nil {
			vs.Health = &HealthCheck{}
			return
		}
		if vs.Health.UDP == nil {
			bad("virtual server %q: a udp service's healthCheck needs the udp probe (udp: {send, expect}): the tcp, http and send/expect checks speak TCP", vs.Name)
		}
	} else if vs.Health != nil && vs.Health.UDP != nil {
		bad("virtual server %q: a udp health check needs protocol udp, not %v", vs.Name, vs.Proto)
	}
	if vs.Health == nil {
		vs.Health = &b
		return
	}
	h := *vs.Health
	if h.Interval == 0 {
		h.Interval = b.Interval
		setDefault(&h.Timeout, b.Timeout)
	}
	setDefault(&h.Rise, b.Rise)
	setDefault(&h.Fall, b.Fall)
	h.compile(bad, "virtual server "+strconv.Quote(vs.Name))
	if h.Interval > 0 && h.Timeout >= h.Interval {
		bad("virtual server %q health check timeout %v must be shorter than interval %v", vs.Name, h.Timeout, h.Interval)
	}
	vs.Health = &h
}

// compileClasses checks that every class's parent chain ends.
func compileClasses(classes []*Class, bad func(string, ...any)) {
	for _, cl := range classes {
		seen := map[*Class]bool{}
		for p := cl; p != nil; p = p.Parent {
			if seen[p] {
				bad("class %q: parent chain loops", cl.Name)
				break
			}
			seen[p] = true
		}
		cl.Limits.check(bad, "class "+strconv.Quote(cl.Name)+" limits")
	}
}

// compileServices checks the virtual servers and their targets, fills
// their defaults and builds the VIP and target indexes.
func (c *Config) compileServices(bad func(string, ...any)) {
	c.byVIP = make(map[netip.Addr][]*VirtualServer)
	c.targetIdx = make(map[*Target]int)
	names := map[string]bool{}
	for _, vs := range c.Services {
		if vs == nil {
			bad("nil virtual server")
			continue
		}
		if names[vs.Name] {
			bad("virtual server %q defined twice", vs.Name)
		}
		names[vs.Name] = true
		vs.Timeouts.resolve(c.Instance.Timeouts, bad, "virtual server "+strconv.Quote(vs.Name))
		vs.HTTP.resolve(bad, "virtual server "+strconv.Quote(vs.Name))
		vs.UDP.resolve(bad, "virtual server "+strconv.Quote(vs.Name))
		vs.Limits.check(bad, "virtual server "+strconv.Quote(vs.Name)+" limits")
		vs.ClientLimits.check(bad, "virtual server "+strconv.Quote(vs.Name)+" clientLimits")
		c.resolveHealth(vs, bad)
		c.resolveHashBy(vs, bad)
		vs.checkProxy(bad)
		if vs.Ports.Lo == 0 || vs.Ports.Hi < vs.Ports.Lo {
			bad("virtual server %q: bad port range %v", vs.Name, vs.Ports)
		}
		if len(vs.VIPs) == 0 {
			bad("virtual server %q has no VIP", vs.Name)
		}
		c.compileTargets(vs, bad)
		c.compileSNI(vs, bad)
		for _, vip := range vs.VIPs {
			vip = vip.Unmap()
			for _, o := range c.byVIP[vip] {
				// A udp service and a tcp one may share a port (DNS on 53,
				// QUIC beside TLS on 443): only one protocol's overlap
				// counts.
				if o.Ports.Overlaps(vs.Ports) && o.IPProto() == vs.IPProto() {
					sharedTLS(vip, o, vs, bad)
				}
			}
			c.byVIP[vip] = append(c.byVIP[vip], vs)
		}
	}
}

// compileTargets names vs's targets, checks them and indexes them.
func (c *Config) compileTargets(vs *VirtualServer, bad func(string, ...any)) {
	tnames := map[string]bool{}
	for _, t := range vs.Targets {
		if t == nil {
			bad("virtual server %q: nil target", vs.Name)
			continue
		}
		c.targetIdx[t] = len(c.targetIdx)
		setDefault(&t.Name, t.DefaultName())
		if tnames[t.Name] {
			bad("virtual server %q: target %q defined twice", vs.Name, t.Name)
		}
		tnames[t.Name] = true
		if t.Weight < 0 {
			bad("virtual server %q: target %q: negative weight", vs.Name, t.Name)
		}
	}
}

// Service returns the virtual server answering on addr:port for IP
// protocol ipProto (IPProtoTCP: a tcp, http or tls service; IPProtoUDP: a
// udp one), or nil. It does not allocate.
func (c *Config) Service(addr netip.Addr, port uint16, ipProto uint8) *VirtualServer {
	for _, vs := range c.byVIP[addr.Unmap()] {
		if vs.Ports.Contains(port) && vs.IPProto() == ipProto {
			return vs
		}
	}
	return nil
}

// TCPService is Service for IPProtoTCP: the tcp, http or tls virtual
// server a TCP connection to addr:port reaches (netstack's
// ForwarderOptions.Services).
func (c *Config) TCPService(addr netip.Addr, port uint16) *VirtualServer {
	return c.Service(addr, port, IPProtoTCP)
}

// TargetIndex returns t's position among all of c's targets, numbered in
// the order of c.Services and then of each service's Targets (the numbering
// datapath.Meters uses for its target rows), or -1 when t is not one of c's
// targets (a target of an older config after a reload). It is a map lookup
// built by Compile: O(1), no allocation.
func (c *Config) TargetIndex(t *Target) int {
	if i, ok := c.targetIdx[t]; ok {
		return i
	}
	return -1
}

// ServiceByName returns the virtual server called name, or nil.
func (c *Config) ServiceByName(name string) *VirtualServer {
	for _, vs := range c.Services {
		if vs.Name == name {
			return vs
		}
	}
	return nil
}

// Cluster is the optional scale-out section: several weir instances with the
// same Name share their enforced connection limits through one Redis. A nil
// Config.Cluster (no `cluster:` key) is a single instance, the behaviour
// without the section.
type Cluster struct {
	// Redis is the server: "host:port" or a redis:// or rediss:// URL.
	// Required.
	Redis string
	// Name is the cluster: instances with the same Name share state.
	// Required.
	Name string
	// Instance identifies this instance among the members; empty means
	// Config.Hostname (filled by Compile).
	Instance string
	// LeaseInterval is how often an instance renews its leases of slots
	// and its membership; zero means DefaultLeaseInterval (1 s). A lease
	// and a membership expire after LeaseTTLFactor intervals without a
	// renewal.
	LeaseInterval time.Duration
	// OnRedisDown is what an enforced limit becomes while Redis cannot be
	// reached; the zero value is LocalShare.
	OnRedisDown RedisDown
	// BorrowTimeout bounds the synchronous borrow of a connection that
	// arrives at a full local share (after the handshake): its Redis round
	// trips and the wait for members holding unused slots to give them
	// back; refused when no slot came within it. Zero means
	// DefaultBorrowTimeout (20 ms). At most half a LeaseInterval.
	BorrowTimeout time.Duration
}

// DefaultBorrowTimeout is Cluster.BorrowTimeout when unset.
// 20 ms: TestBorrowWait (three instances against a real redis-server on a
// loaded 2-core host) served every burst at 20 and 50 ms, and 181 of 200 at
// 5 ms; a borrow that succeeds takes p99 3-4 ms either way.
const DefaultBorrowTimeout = 20 * time.Millisecond

// DefaultLeaseInterval is Cluster.LeaseInterval when unset.
const DefaultLeaseInterval = time.Second

// LeaseTTLFactor is how many lease intervals a lease or a membership lives
// without a renewal: a dead instance's slots are free again after at most
// LeaseTTLFactor × LeaseInterval.
const LeaseTTLFactor = 3

// RedisDown is the fallback while Redis is unreachable.
type RedisDown uint8

const (
	// LocalShare enforces limit ÷ live members (rounded down) on each
	// instance, with the members as last seen.
	LocalShare RedisDown = iota // localShare
	// FailOpen enforces each limit locally in full (the cluster-wide sum
	// may reach members × limit).
	FailOpen // failOpen
	// FailClosed refuses every connection at an enforced connection limit.
	// The other members also keep a silent member's slots one lease
	// lifetime longer (a crashed member's slots free after two), so that
	// a paused member that resumes finds its slots still its own.
	FailClosed // failClosed
)

// ParseRedisDown parses a RedisDown's String form.
func ParseRedisDown(s string) (RedisDown, error) {
	for d := LocalShare; d <= FailClosed; d++ {
		if d.String() == s {
			return d, nil
		}
	}
	return 0, fmt.Errorf("unknown onRedisDown %q (want localShare, failOpen or failClosed)", s)
}

// compileCluster fills the cluster section's defaults and checks it.
// hostname (Config.Hostname) is Instance's default.
func compileCluster(cl *Cluster, hostname string, bad func(string, ...any)) {
	if cl.Redis == "" {
		bad("cluster: redis (an address or URL) is required")
	}
	if cl.Name == "" {
		bad("cluster: name is required")
	}
	if strings.ContainsAny(cl.Name, "{}") || strings.ContainsAny(cl.Instance, "{}") {
		bad("cluster: name and instance may not contain { or } (Redis key hash tags)")
	}
	if cl.Instance == "" {
		if hostname == "" {
			bad("cluster: instance not set and the host name is unknown: set instance")
		}
		cl.Instance = hostname
	}
	if cl.LeaseInterval == 0 {
		cl.LeaseInterval = DefaultLeaseInterval
	}
	if cl.LeaseInterval < 10*time.Millisecond {
		bad("cluster: leaseInterval %v is below 10ms", cl.LeaseInterval)
	}
	if cl.OnRedisDown > FailClosed {
		bad("cluster: unknown onRedisDown %v", cl.OnRedisDown)
	}
	if cl.BorrowTimeout == 0 {
		// The default, within its bound for a short lease interval.
		cl.BorrowTimeout = min(DefaultBorrowTimeout, cl.LeaseInterval/2)
	}
	if cl.BorrowTimeout < 0 || cl.BorrowTimeout > cl.LeaseInterval/2 {
		bad("cluster: borrowTimeout %v is out of range 0..leaseInterval/2 (%v)", cl.BorrowTimeout, cl.LeaseInterval/2)
	}
}
