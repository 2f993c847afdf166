// Package appliance wires weir's parts into one running product:
//
//	front Device ──► datapath.Engine (flow: service, action) ──► netstack.Stack (front NIC)
//	   ──► Forwarder ──► admit.Admitter: policy.Admission (limits) ──► balancer.PickAction
//	   ──► a session per connection ──► dial (host socket | back NIC)
//	       DialFailed: the next pick, until the tried-set refuses
//	   ──► splice ──► End: release the slot and ticket, write the access line
//
// and runs the control loops around them: the recompute loop (every
// RecomputeInterval: the meters' byte totals → admission bandwidth windows,
// limit events → the error log) and the sampling loop (every SamplingInterval: per-target
// TCP measurements → policy weight fractions → balancer weights, STATS
// lines). It serves its state (Status, built by package status) to the
// admin API and Prometheus, and reloads a new compiled configuration
// without dropping a connection or losing a counter.
//
// The appliance is the control plane: it logs, it reads the clock, it may
// allocate per connection. It never does per-packet work; that is the
// datapath's.
package appliance

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"weir/balancer"
	"weir/cmd/weir/api"
	"weir/cmd/weir/internal/admit"
	"weir/cmd/weir/internal/cluster"
	"weir/cmd/weir/internal/health"
	"weir/cmd/weir/internal/hostleg"
	"weir/cmd/weir/internal/obs"
	"weir/cmd/weir/internal/status"
	"weir/datapath"
	"weir/datapath/hostcap"
	"weir/netstack"
	"weir/netstack/proxy"
	proxyhttp "weir/netstack/proxy/http"
	udprelay "weir/netstack/proxy/udp"
	"weir/policy"
)

// Options configure an Appliance. Config and Front are required; the zero
// value of everything else works.
type Options struct {
	// Config is the compiled policy to start with.
	Config *policy.Config
	// Source names where Config came from (a file path), for status.
	Source string

	// Front is the transport toward clients: a TUN, or one end of an
	// in-memory pair. It answers for every VIP (promiscuous) and is the
	// default route, so replies reach clients wherever they are.
	Front datapath.Device
	// FrontQueues are further queues of the front transport (a multiqueue
	// TUN): each gets its own datapath worker and NIC, so a flow stays on
	// the queue it arrived on.
	FrontQueues []datapath.Device
	// Backs are the back arms: further NICs through which targets with
	// `via: netstack` are dialed, each on its own Device (a second TUN, a
	// memory pair). A target is reached through the arm whose routes hold
	// its address.
	Backs []BackArm

	// Stack, Forwarder and Proxy tune the userspace TCP/IP stack, its
	// accept path and the proxy behind it; their zero values are weir's
	// measured defaults. The appliance fills in what it wires itself (the
	// services, admitters, dialers, meters, clock and panic report).
	Stack     netstack.Options
	Forwarder netstack.ForwarderOptions
	Proxy     proxy.Options

	// Log is the main log; nil discards. Access, when set, gets one line
	// per connection.
	Log    *zerolog.Logger
	Access *obs.AccessLog
	// LogDrops, when set, counts the main log's lines lost because its
	// writer could not keep up (obs.Logs.Dropped), for /status and metrics.
	LogDrops func() uint64
	// OnSample, when set, is called with the status after every sampling
	// step of the sampling loop (a ui.Recorder's Record: the history the
	// status page draws). It runs in the sampling loop's goroutine.
	OnSample func(api.Status)

	// HostCapture, when set, measures the via: host target legs (see
	// hostcap.go); the caller opened it (it needs CAP_NET_RAW) and closes
	// it after Close. HostCaptureWhy says why it is nil, for /status.
	HostCapture    *hostcap.Capture
	HostCaptureWhy string

	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// BackArm is one back NIC. Its packets pass the datapath engine, which
// measures each target leg's segments in both directions (see
// datapath.SegStats).
type BackArm struct {
	Name string // for errors and stats; "" means back<i>
	// Device is the arm's transport; nil means the front device: the arm's
	// packets leave through it and its replies come back on the front NIC
	// (datapath.EgressOnly), as `weir run` does with its one TUN.
	Device datapath.Device
	// Addrs are the arm's own addresses with their prefixes; the prefixes
	// route the targets inside them through this arm.
	Addrs []netip.Prefix
	// Routes are further destinations reached through this arm; nil means
	// only the Addrs' prefixes.
	Routes []netip.Prefix
}

// Appliance is a running weir.
type Appliance struct {
	opts Options
	log  zerolog.Logger
	now  func() time.Time

	cfg     atomic.Pointer[policy.Config]
	reloads status.Reloads // generations, the last rejected config

	adm     *policy.Admission
	balMu   sync.Mutex // serialises reloads of the balancer map
	bals    atomic.Pointer[map[string]*balancer.Balancer]
	sampler *policy.Sampler // sampling loop only

	engine  *datapath.Engine
	stack   *netstack.Stack
	nics    []nicEntry          // every NIC, front ones first, with its device
	fwd     *netstack.Forwarder // the accept path: hands connections to px
	px      *proxy.Proxy        // admission, dials, splices; http services through hs
	hs      *proxyhttp.Server
	udp     *netstack.UDPFront // the VIP endpoints of udp services: datagrams to relay
	relay   *udprelay.Relay    // udp sessions: admission, target sockets, expiry
	udpBack udprelay.Dialer    // the relay's back-arm dialer (nil: no back arm), for the udp health checks

	checks health.Supervisor // a health checker per service, from Start

	explMu sync.Mutex
	expl   []policy.Explanation // last sampling interval's, by service then target
	explAt time.Time
	// actionFr holds, per service, action and target, the fractions of the
	// action levels last given to the balancers (applyFractions), for
	// /status; guarded by explMu.
	actionFr map[string]map[string]map[string]int

	admit *admit.Admitter // connections and requests (package admit)
	skips obs.SkipLog     // targets passed over at their maxConnections

	clu       *cluster.Cluster // nil without a cluster section
	cluCancel context.CancelFunc
	cluDefCap int64 // the share a balancer built by a reload starts with; by balMu

	host *hostleg.Capture // the host-leg capture
	segs status.Totals    // every target's segment counts

	stop chan struct{}
	wg   sync.WaitGroup
}

// New builds the appliance: the stack, its NICs and forwarder, the admission
// state and a balancer per virtual server. Call Start to run the loops.
func New(opts Options) (*Appliance, error) {
	if opts.Config == nil {
		return nil, errors.New("appliance: no config")
	}
	if opts.Front == nil {
		return nil, errors.New("appliance: no front device")
	}
	cfg, err := policy.Compile(opts.Config)
	if err != nil {
		return nil, err
	}
	a := &Appliance{
		opts:    opts,
		log:     zerolog.Nop(),
		now:     opts.Now,
		sampler: policy.NewSampler(),
		stop:    make(chan struct{}),
	}
	if opts.Log != nil {
		a.log = *opts.Log
	}
	if a.now == nil {
		a.now = time.Now
	}
	a.checks = health.Supervisor{Plan: a.healthPlan, Report: a.reportHealth, Now: a.now}
	a.cfg.Store(cfg)
	a.reloads.Loaded(a.now())
	a.adm = policy.NewAdmission(cfg, 0)
	bals := map[string]*balancer.Balancer{}
	for _, vs := range cfg.Services {
		bals[vs.Name] = a.newBalancer(vs, cfg)
	}
	a.bals.Store(&bals)

	a.engine = datapath.NewEngine(opts.Front, cfg, datapath.EngineOptions{Workers: 1 + len(opts.FrontQueues) + len(opts.Backs),
		BackPrefixes: backPrefixes(opts.Backs)})

	a.stack, err = netstack.New(opts.Stack)
	if err != nil {
		return nil, err
	}
	front, err := a.stack.AddNIC(a.engine, netstack.NICOptions{Name: "front", Promiscuous: true})
	if err != nil {
		a.stack.Close()
		return nil, err
	}
	a.nics = append(a.nics, nicEntry{name: "front", nic: front, dev: opts.Front})
	for i, q := range opts.FrontQueues {
		name := fmt.Sprintf("front%d", i+1)
		nic, err := a.stack.AddNIC(a.engine.Attach(q, i+1), netstack.NICOptions{Name: name, Promiscuous: true})
		if err != nil {
			a.stack.Close()
			return nil, fmt.Errorf("front queue %d: %w", i+1, err)
		}
		a.nics = append(a.nics, nicEntry{name: name, nic: nic, dev: q})
	}
	fo, po := opts.Forwarder, opts.Proxy
	fo.Services = a.service
	a.admit = admit.New(admit.Options{Admission: a.adm, Balancer: a.balancer, Flows: a.engine,
		Log: &a.log, Access: opts.Access, Now: a.now, Borrow: a.borrow, BorrowTarget: a.borrowTarget})
	po.Admitter = a.admit
	a.hs = proxyhttp.New(proxyhttp.Options{RequestAdmitter: a.admit})
	po.HTTP = a.hs
	po.Host, po.Back = &netstack.HostDialer{}, &netstack.StackDialer{}
	meter := &netstack.LegMeter{Segments: a.engine.Segments}
	po.Meter = meter
	a.host = hostleg.New(opts.HostCapture, opts.HostCaptureWhy)
	if hc := a.host.Capture(); hc != nil {
		meter.HostSegments = hc.Segments
		meter.HostSync = func() { hc.Sync(100 * time.Millisecond) }
		meter.HostRelease = hc.Release
		a.setHostTargets(cfg)
	}
	viaFront := false
	for i, arm := range opts.Backs {
		name := arm.Name
		if name == "" {
			name = fmt.Sprintf("back%d", i)
		}
		routes := append([]netip.Prefix(nil), arm.Routes...)
		for _, p := range arm.Addrs {
			routes = append(routes, p.Masked())
		}
		var dev datapath.Device
		if arm.Device == nil {
			// The arm's packets leave through the front device and its
			// replies come back on the front NIC (promiscuous).
			dev = datapath.NewEgressOnly(a.engine.Attach(opts.Front, 0))
		} else {
			dev = a.engine.Attach(arm.Device, 1+len(opts.FrontQueues)+i)
		}
		nic, err := a.stack.AddNIC(dev, netstack.NICOptions{Name: name, Addrs: arm.Addrs, Routes: routes})
		if err != nil {
			a.stack.Close()
			return nil, fmt.Errorf("back arm %s: %w", name, err)
		}
		a.nics = append(a.nics, nicEntry{name: name, back: true, nic: nic, dev: arm.Device})
		if arm.Device == nil {
			// An arm through the front device shares the front NIC's
			// default route: its dials name their NIC.
			po.Back, viaFront = &netstack.StackDialer{Stack: a.stack, NIC: nic}, true
		} else if !viaFront {
			po.Back = &netstack.StackDialer{Stack: a.stack}
		}
	}
	po.OnPanic = a.admit.Panic
	po.RouteSNI = func(vip netip.AddrPort, serverName string) *policy.VirtualServer {
		return a.cfg.Load().RouteSNI(vip.Addr(), vip.Port(), serverName)
	}
	po.OnProxyRefused = a.admit.ProxyRefused
	fo.OnPanic = a.admit.Panic
	if cfg.Cluster != nil {
		// Before the forwarder admits anything: cluster.New holds every
		// enforced level at zero slots until the first lease (Start).
		a.clu, err = cluster.New(cluster.Options{Config: *cfg.Cluster, Admission: a.adm, Targets: clusterTargets{a},
			Logf: func(f string, args ...any) { a.log.Warn().Msgf(f, args...) }})
		if err != nil {
			a.stack.Close()
			return nil, err
		}
	}
	a.px = proxy.New(po)
	fo.Handler = a.px
	a.fwd = netstack.NewForwarder(a.stack, fo) // closes px
	// udp services: sessions admitted by the same admission and balancers,
	// their target sockets host sockets or the back arm's.
	ro := udprelay.Options{Admitter: a.admit, Host: &udprelay.HostDialer{}, Now: a.now}
	if sd, ok := po.Back.(*netstack.StackDialer); ok && sd.Stack != nil {
		ro.Back = sd
		a.udpBack = sd
	}
	a.relay = udprelay.New(ro)
	a.udp = netstack.NewUDPFront(a.stack, a.relay, a.udpService)
	a.listen(cfg)
	return a, nil
}

// backPrefixes are the back arms' own addresses, each as a host prefix: the
// engine measures the TCP flows whose weir end is one of them.
func backPrefixes(arms []BackArm) []netip.Prefix {
	var out []netip.Prefix
	for _, arm := range arms {
		for _, p := range arm.Addrs {
			out = append(out, netip.PrefixFrom(p.Addr().Unmap(), p.Addr().Unmap().BitLen()))
		}
	}
	return out
}

// service is the tcp, http or tls virtual server at addr and port for the
// TCP forwarder: a port only a udp service has takes no connections (its
// SYNs get RST).
func (a *Appliance) service(addr netip.Addr, port uint16) *policy.VirtualServer {
	if vs := a.cfg.Load().Service(addr, port, policy.IPProtoTCP); vs != nil {
		return vs
	}
	return nil
}

// udpService is the udp virtual server at addr and port, for the UDP front.
func (a *Appliance) udpService(addr netip.Addr, port uint16) *policy.VirtualServer {
	if vs := a.cfg.Load().Service(addr, port, policy.IPProtoUDP); vs != nil {
		return vs
	}
	return nil
}

func (a *Appliance) balancer(name string) *balancer.Balancer {
	return (*a.bals.Load())[name]
}

// Config returns the configuration in force.
func (a *Appliance) Config() *policy.Config { return a.cfg.Load() }

// DatapathStats returns the front datapath's counters now.
func (a *Appliance) DatapathStats() datapath.EngineStats { return a.engine.Stats() }

// StackStats returns the counters of weir's own TCP/IP stack now.
func (a *Appliance) StackStats() netstack.StackStats { return a.stack.Stats() }

// nicEntry is one of the appliance's NICs with its device, for RawStats.
type nicEntry struct {
	name string
	back bool // a back arm, not a front NIC
	nic  *netstack.NIC
	dev  datapath.Device // nil for a back arm through the front device
}

// RawStats returns the raw counters of every part now.
func (a *Appliance) RawStats() status.RawStats {
	st := status.RawStats{
		Datapath:               a.engine.Stats(),
		Flows:                  a.engine.Flows().Stats(),
		Stack:                  a.stack.Stats(),
		Forwarder:              a.fwd.Stats(),
		Proxy:                  a.px.Stats(),
		HTTP:                   a.hs.Stats(),
		UDPFront:               a.udp.Stats(),
		UDP:                    a.relay.Stats(),
		AdmissionEventsDropped: a.adm.DroppedEvents(),
		NICs:                   make([]status.NICStats, len(a.nics)),
	}
	for i, n := range a.nics {
		st.NICs[i] = status.NICStats{Name: n.name, Back: n.back, Link: n.nic.Stats()}
		if r, ok := n.dev.(datapath.StatsReporter); ok {
			st.NICs[i].Device, st.NICs[i].HasDevice = r.Stats(), true
		}
	}
	return st
}

// Start runs the recompute and sampling loops until Close.
func (a *Appliance) Start() {
	a.wg.Add(2)
	go a.recomputeLoop()
	go a.sampleLoop()
	a.wg.Go(func() { a.relay.Run(a.stop) })
	if a.clu != nil {
		ctx, cancel := context.WithCancel(context.Background())
		a.cluCancel = cancel
		a.wg.Go(func() { a.clu.Loop(ctx) })
	}
	a.checks.Start(sortedNames(*a.bals.Load()))
}

// healthPlan returns the health checks of service name in the current
// config; each target is dialed the way its connections (a udp service's:
// its sessions) go: through the back arm for `via: netstack` targets, else
// a host socket.
func (a *Appliance) healthPlan(name string) health.Plan {
	vs := a.cfg.Load().ServiceByName(name)
	if vs == nil {
		return health.Plan{}
	}
	return health.Plan{Settings: *vs.Health, Targets: health.ServiceTargets(vs, func(v policy.DialVia) health.DialFunc {
		if v == policy.DialNetstack {
			return func(ctx context.Context, addr netip.AddrPort) (net.Conn, error) {
				return a.stack.DialTCP(ctx, netip.AddrPort{}, addr)
			}
		}
		return health.HostDial
	}, func(v policy.DialVia) health.UDPDialFunc {
		if v == policy.DialNetstack {
			return func(ctx context.Context, addr netip.AddrPort) (udprelay.Target, error) {
				if a.udpBack == nil {
					return nil, netstack.ErrNoBackArm
				}
				return a.udpBack.DialUDP(ctx, addr)
			}
		}
		return health.HostDialUDP
	})}
}

// reportHealth hands a check's verdict to the target's balancer.
func (a *Appliance) reportHealth(service, target string, r health.Result, now time.Time) {
	if b := a.balancer(service); b != nil {
		b.ReportCheck(target, r.OK, r.Reason, now)
	}
}

// newBalancer builds a service's balancer, its ejections logged once each.
func (a *Appliance) newBalancer(vs *policy.VirtualServer, cfg *policy.Config) *balancer.Balancer {
	b := balancer.New(vs, cfg.Balancer)
	b.OnEject(func(e balancer.Ejection) {
		a.log.Warn().Str("service", e.Service).Str("target", e.Target).Int("failures", e.Failures).
			Time("until", e.Until).Int("ejected", e.Ejected).Int("targets", e.Targets).
			Msg("target ejected: consecutive failures (balancer.ejection); back at until")
	})
	return b
}

// Reload swaps in a new configuration: limits, balancers (counts and
// down-state carry over by target name), rules and meters (by name). Open
// connections keep running and count against the new limits. cfg must be
// compiled; Reload fails, and nothing changes, only where Compile refuses it
// or its cluster section changed.
func (a *Appliance) Reload(cfg *policy.Config) error {
	cfg, err := policy.Compile(cfg)
	if err != nil {
		return a.reloadFailed(err)
	}
	if old := a.cfg.Load().Cluster; !sameCluster(old, cfg.Cluster) {
		return a.reloadFailed(errors.New("the cluster section changed: it takes effect on a restart, not a reload"))
	}
	a.balMu.Lock()
	defer a.balMu.Unlock()
	old := *a.bals.Load()
	next := make(map[string]*balancer.Balancer, len(cfg.Services))
	for _, vs := range cfg.Services {
		b := old[vs.Name]
		if b != nil {
			b.Update(vs, cfg.Balancer)
		} else {
			b = a.newBalancer(vs, cfg)
			if a.clu != nil {
				b.SetDefaultCapacity(a.cluDefCap) // no slots until the cluster leases them
			}
		}
		next[vs.Name] = b
	}
	a.adm.Apply(cfg)
	a.engine.SetConfig(cfg)
	a.setHostTargets(cfg)
	a.cfg.Store(cfg)
	a.bals.Store(&next)
	gen := a.reloads.Loaded(a.now())
	a.checks.Sync(sortedNames(next))
	a.listen(cfg)
	a.monitorOff(cfg)
	a.log.Info().Int64("generation", gen).Int("services", len(cfg.Services)).Msg("configuration reloaded")
	return nil
}

func (a *Appliance) reloadFailed(err error) error {
	a.reloads.Failed(a.now(), err)
	a.log.Error().Err(err).Msg("configuration rejected; the previous one keeps running")
	return err
}

// ReloadFailed records a configuration that could not even be parsed, so
// that /status shows it; the running configuration is unchanged.
func (a *Appliance) ReloadFailed(err error) { a.reloadFailed(err) }

// Drain stops admitting new connections (they are refused with RST) and waits
// until the open ones have closed or ctx ends, whichever is first. It returns
// the number of connections still open.
func (a *Appliance) Drain(ctx context.Context) int {
	a.admit.Drain()
	a.fwd.Drain() // new SYNs get RST, before any SYN-ACK
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		n := a.OpenConnections()
		if n == 0 {
			return 0
		}
		select {
		case <-ctx.Done():
			return n
		case <-t.C:
		}
	}
}

// OpenConnections is the number of admitted connections not yet ended: a
// counter the sessions keep, not a scan.
func (a *Appliance) OpenConnections() int { return a.admit.Open() }

// Close stops the loops, the forwarder (closing open connections) and the
// stack.
func (a *Appliance) Close() error {
	select {
	case <-a.stop:
		return nil
	default:
	}
	close(a.stop)
	a.checks.Close()
	if a.cluCancel != nil {
		a.cluCancel()
	}
	a.wg.Wait()
	if a.clu != nil {
		a.clu.Close() // gives the slots back; unreturned ones expire
	}
	a.udp.Close()   // no more datagrams
	a.relay.Close() // every udp session ends
	err := a.fwd.Close()
	if e := a.stack.Close(); err == nil {
		err = e
	}
	return err
}

// listen makes the forwarder listen on cfg's VIPs and ports (SYN cookies,
// per-VIP backlogs). A listener that cannot be opened is logged: its SYNs
// still reach the forwarder's fallback path.
func (a *Appliance) listen(cfg *policy.Config) {
	tcp := make([]*policy.VirtualServer, 0, len(cfg.Services))
	for _, vs := range cfg.Services {
		if vs.Proto != policy.ProtoUDP {
			tcp = append(tcp, vs)
		}
	}
	if err := a.fwd.Listen(tcp); err != nil {
		a.log.Warn().Err(err).Msg("some VIPs have no listener (no SYN cookies for them)")
	}
	if err := a.udp.Listen(cfg.Services); err != nil {
		a.log.Error().Err(err).Msg("some udp VIPs have no endpoint: their datagrams get ICMP port unreachable")
	}
}

// setHostTargets points the host-leg capture at cfg's via: host targets.
func (a *Appliance) setHostTargets(cfg *policy.Config) {
	if err := a.host.SetTargets(cfg); err != nil {
		a.log.Error().Err(err).Msg("host capture: the filter on the via: host targets could not be set; their from_target is an estimate")
	}
}

// sortedNames returns the names of cfg's services in file order.
func sortedNames(m map[string]*balancer.Balancer) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// sameCluster reports whether two compiled cluster sections are equal.
func sameCluster(a, b *policy.Cluster) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}
