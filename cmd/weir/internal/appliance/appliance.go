// Package appliance wires weir's parts into one running product:
//
//	front Device ──► datapath.Engine (flow: service, action) ──► netstack.Stack (front NIC)
//	   ──► Forwarder ──► Admit: policy.Admission (limits) ──► balancer.PickAction
//	   ──► a session per connection ──► dial (host socket | back NIC)
//	       DialFailed: the next pick, until the tried-set refuses
//	   ──► splice ──► End: release the slot and ticket, write the access line
//
// and runs the control loops around them: the recompute loop (every
// RecomputeInterval: the meters' byte totals → admission bandwidth windows,
// limit events → the error log) and the sampling loop (every SamplingInterval: per-target
// TCP measurements → policy weight fractions → balancer weights, STATS
// lines). It serves its state to the admin API and Prometheus, and reloads a
// new configuration without dropping a connection or losing a counter.
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

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"weir/balancer"
	"weir/cmd/weir/api"
	"weir/cmd/weir/internal/cluster"
	"weir/cmd/weir/internal/health"
	"weir/cmd/weir/internal/metrics"
	"weir/cmd/weir/internal/obs"
	"weir/datapath"
	"weir/netstack"
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

	// Stack and Forwarder tune the userspace TCP/IP stack and the
	// forwarder; their zero values are weir's measured defaults.
	Stack     netstack.Options
	Forwarder netstack.ForwarderOptions

	// Log is the main log; nil discards. Access, when set, gets one line
	// per connection.
	Log    *zerolog.Logger
	Access *obs.AccessLog
	// Registerer receives weir's metrics; nil means none are registered.
	Registerer prometheus.Registerer
	// LogDrops, when set, counts the main log's lines lost because its
	// writer could not keep up (obs.Logs.Dropped), for /status and metrics.
	LogDrops func() uint64
	// OnSample, when set, is called with the status after every sampling
	// step of the sampling loop (a ui.Recorder's Record: the history the
	// status page draws). It runs in the sampling loop's goroutine.
	OnSample func(api.Status)

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
	// (see backarm.go), as `weir run` does with its one TUN.
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

	cfg       atomic.Pointer[policy.Config]
	gen       atomic.Int64
	loadedAt  atomic.Pointer[time.Time]
	reloadErr atomic.Pointer[reloadError]

	adm     *policy.Admission
	balMu   sync.Mutex // serialises reloads of the balancer map
	bals    atomic.Pointer[map[string]*balancer.Balancer]
	sampler *policy.Sampler // sampling loop only

	engine *datapath.Engine
	stack  *netstack.Stack
	front  *netstack.NIC
	nics   []NICStats // every NIC, front ones first, with its device (Stats empty)
	fwd    *netstack.Forwarder

	checkMu  sync.Mutex                    // guards checks
	checks   map[string]context.CancelFunc // health checker per service, while running
	open     atomic.Int64                  // sessions that hold a target slot and have not ended
	draining atomic.Bool

	explMu sync.Mutex
	expl   []policy.Explanation // last sampling interval's, by service then target
	explAt time.Time
	segs   map[policy.TargetKey]*Segments // guarded by explMu; see segments.go
	// actionFr holds, per service, action and target, the fractions of the
	// action levels last given to the balancers (applyFractions), for
	// /status; guarded by explMu.
	actionFr map[string]map[string]map[string]int

	counters counters
	reqs     requestStats // http requests (httpadmit.go)
	clients  sync.Map     // service name → *atomic.Int64: open http client connections
	skipMu   sync.Mutex
	skipped  map[policy.TargetKey]uint64 // SkippedAtLimit already warned about
	limiter  obs.Limiter

	clu       *cluster.Cluster // nil without a cluster section
	cluCancel context.CancelFunc
	cluDefCap int64 // the share a balancer built by a reload starts with; by balMu

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
	a.cfg.Store(cfg)
	now := a.now()
	a.loadedAt.Store(&now)
	a.gen.Store(1)
	a.adm = policy.NewAdmission(cfg, 0)
	bals := map[string]*balancer.Balancer{}
	for _, vs := range cfg.Services {
		b, err := balancer.New(vs, cfg.Balancer)
		if err != nil {
			return nil, fmt.Errorf("virtual server %s: %w", vs.Name, err)
		}
		bals[vs.Name] = b
	}
	a.bals.Store(&bals)

	a.engine = datapath.NewEngine(opts.Front, cfg, datapath.EngineOptions{Workers: 1 + len(opts.FrontQueues) + len(opts.Backs),
		BackPrefixes: backPrefixes(opts.Backs)})

	a.stack, err = netstack.New(opts.Stack)
	if err != nil {
		return nil, err
	}
	a.front, err = a.stack.AddNIC(a.engine, netstack.NICOptions{Name: "front", Promiscuous: true})
	if err != nil {
		a.stack.Close()
		return nil, err
	}
	a.nics = append(a.nics, NICStats{Name: "front", nic: a.front, dev: opts.Front})
	for i, q := range opts.FrontQueues {
		name := fmt.Sprintf("front%d", i+1)
		nic, err := a.stack.AddNIC(a.engine.Attach(q, i+1), netstack.NICOptions{Name: name, Promiscuous: true})
		if err != nil {
			a.stack.Close()
			return nil, fmt.Errorf("front queue %d: %w", i+1, err)
		}
		a.nics = append(a.nics, NICStats{Name: name, nic: nic, dev: q})
	}
	fo := opts.Forwarder
	fo.Services = a.service
	fo.Admitter = a
	fo.Segments = a.engine.Segments
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
			dev = newEgressOnly(a.engine.Attach(opts.Front, 0))
		} else {
			dev = a.engine.Attach(arm.Device, 1+len(opts.FrontQueues)+i)
		}
		nic, err := a.stack.AddNIC(dev, netstack.NICOptions{Name: name, Addrs: arm.Addrs, Routes: routes})
		if err != nil {
			a.stack.Close()
			return nil, fmt.Errorf("back arm %s: %w", name, err)
		}
		a.nics = append(a.nics, NICStats{Name: name, Back: true, nic: nic, dev: arm.Device})
		if arm.Device == nil {
			// An arm through the front device shares the front NIC's
			// default route: its dials name their NIC.
			fo.Back, viaFront = &netstack.StackDialer{Stack: a.stack, NIC: nic}, true
		} else if !viaFront {
			fo.Back = &netstack.StackDialer{Stack: a.stack}
		}
	}
	fo.OnPanic = a.connPanic
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
	a.fwd = netstack.NewForwarder(a.stack, fo)
	a.listen(cfg)
	if opts.Registerer != nil {
		if err := opts.Registerer.Register(metrics.NewCollector(a.Status)); err != nil {
			a.Close()
			return nil, fmt.Errorf("metrics: %w", err)
		}
	}
	return a, nil
}

func (a *Appliance) service(addr netip.Addr, port uint16) *policy.VirtualServer {
	return a.cfg.Load().Service(addr, port)
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

// RawStats are the raw counters of the appliance's parts at one moment:
// every counted drop of the datapath, the flow table, the stack, its NICs
// and their devices, the forwarder and the admission is in one of them.
// They are totals since New; the metrics table and /status export them.
type RawStats struct {
	Datapath  datapath.EngineStats
	Flows     datapath.FlowTableStats // Refused: flows the full table did not cache
	Stack     netstack.StackStats
	Forwarder netstack.ForwarderStats
	// NICs are the front NIC, the further front queues' and the back
	// arms', in that order.
	NICs []NICStats
	// AdmissionEventsDropped counts limit crossings the admission's event
	// buffer had no room for (their log lines are lost; the state in
	// /status is not).
	AdmissionEventsDropped uint64
}

// NICStats are one NIC's counters: the link's between stack and device
// (DroppedQueueFull: egress packets the full write queue dropped), and the
// device's own when it counts (a datapath.StatsReporter: a memory pair, a
// TUN that reports).
type NICStats struct {
	Name string
	Back bool // a back arm, not a front NIC
	Link netstack.LinkStats
	// Device holds the device's counters when HasDevice is set.
	Device    datapath.DeviceStats
	HasDevice bool

	nic *netstack.NIC
	dev datapath.Device
}

// RawStats returns the raw counters of every part now.
func (a *Appliance) RawStats() RawStats {
	st := RawStats{
		Datapath:               a.engine.Stats(),
		Flows:                  a.engine.Flows().Stats(),
		Stack:                  a.stack.Stats(),
		Forwarder:              a.fwd.Stats(),
		AdmissionEventsDropped: a.adm.DroppedEvents(),
		NICs:                   make([]NICStats, len(a.nics)),
	}
	for i, n := range a.nics {
		st.NICs[i] = NICStats{Name: n.Name, Back: n.Back, Link: n.nic.Stats()}
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
	if a.clu != nil {
		ctx, cancel := context.WithCancel(context.Background())
		a.cluCancel = cancel
		a.wg.Go(func() { a.clu.Loop(ctx) })
	}
	a.checkMu.Lock()
	a.checks = map[string]context.CancelFunc{}
	a.checkMu.Unlock()
	a.syncCheckers()
}

// syncCheckers runs one health checker per balancer (it idles while the
// config has no health check) and stops those of services gone in a reload.
// Before Start it does nothing.
func (a *Appliance) syncCheckers() {
	a.checkMu.Lock()
	defer a.checkMu.Unlock()
	if a.checks == nil {
		return
	}
	bals := *a.bals.Load()
	for name, cancel := range a.checks {
		if bals[name] == nil {
			cancel()
			delete(a.checks, name)
		}
	}
	for name, b := range bals {
		if a.checks[name] != nil {
			continue
		}
		ctx, cancel := context.WithCancel(context.Background())
		a.checks[name] = cancel
		c := &health.Checker{Plan: a.healthPlan(name), Report: func(target string, ok bool, now time.Time) { b.ReportHealth(target, ok, now) }, Now: a.now}
		a.wg.Go(func() { c.Loop(ctx) })
	}
}

// healthPlan returns the health checks of service name in the current
// config; each target is dialed the way its connections go: through the
// back arm for `via: netstack` targets, else a host socket.
func (a *Appliance) healthPlan(name string) func() health.Plan {
	dial := func(v policy.DialVia) health.DialFunc {
		if v == policy.DialNetstack {
			return func(ctx context.Context, addr netip.AddrPort) (net.Conn, error) {
				return a.stack.DialTCP(ctx, netip.AddrPort{}, addr)
			}
		}
		return health.HostDial
	}
	return func() health.Plan {
		cfg := a.cfg.Load()
		vs := cfg.ServiceByName(name)
		if vs == nil {
			return health.Plan{}
		}
		return health.Plan{Settings: cfg.Balancer.Health, Targets: health.ServiceTargets(vs, dial)}
	}
}

// Reload swaps in a new configuration: limits, balancers (counts and
// down-state carry over by target name), rules and meters (by name). Open
// connections keep running and count against the new limits. cfg must be
// compiled; Reload cannot fail on a compiled config except where a virtual
// server's balancer cannot be built, in which case nothing changes.
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
		if b := old[vs.Name]; b != nil {
			next[vs.Name] = b
			continue
		}
		b, err := balancer.New(vs, cfg.Balancer)
		if err != nil {
			return a.reloadFailed(fmt.Errorf("virtual server %s: %w", vs.Name, err))
		}
		if a.clu != nil {
			b.SetDefaultCapacity(a.cluDefCap) // no slots until the cluster leases them
		}
		next[vs.Name] = b
	}
	// Every check passed: from here on the swap cannot fail half-way.
	for _, vs := range cfg.Services {
		if b := old[vs.Name]; b != nil {
			if err := b.Update(vs, cfg.Balancer); err != nil {
				return a.reloadFailed(fmt.Errorf("virtual server %s: %w", vs.Name, err))
			}
		}
	}
	a.adm.Apply(cfg)
	a.engine.SetConfig(cfg)
	a.cfg.Store(cfg)
	a.bals.Store(&next)
	now := a.now()
	a.loadedAt.Store(&now)
	a.gen.Add(1)
	a.reloadErr.Store(nil)
	a.syncCheckers()
	a.listen(cfg)
	a.monitorOff(cfg)
	a.counters.reloads.Add(1)
	a.log.Info().Int64("generation", a.gen.Load()).Int("services", len(cfg.Services)).Msg("configuration reloaded")
	return nil
}

func (a *Appliance) reloadFailed(err error) error {
	a.reloadErr.Store(&reloadError{At: a.now(), Err: err.Error()})
	a.counters.reloadFailures.Add(1)
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
	a.draining.Store(true)
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
func (a *Appliance) OpenConnections() int { return int(a.open.Load()) }

// Close stops the loops, the forwarder (closing open connections) and the
// stack.
func (a *Appliance) Close() error {
	select {
	case <-a.stop:
		return nil
	default:
	}
	close(a.stop)
	a.checkMu.Lock()
	for _, cancel := range a.checks {
		cancel()
	}
	a.checks = nil
	a.checkMu.Unlock()
	if a.cluCancel != nil {
		a.cluCancel()
	}
	a.wg.Wait()
	if a.clu != nil {
		a.clu.Close() // gives the slots back; unreturned ones expire
	}
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
	if err := a.fwd.Listen(cfg.Services); err != nil {
		a.log.Warn().Err(err).Msg("some VIPs have no listener (no SYN cookies for them)")
	}
}

// connPanic logs a panic recovered in a connection's goroutines, once, with
// the connection and the stack; the forwarder has counted it
// (weir_forwarder_panics_total) and closed that connection.
func (a *Appliance) connPanic(req *netstack.ConnRequest, v any, stack []byte) {
	ev := a.log.Error().Str("panic", fmt.Sprint(v)).Bytes("stack", stack)
	if req.ID != 0 {
		ev = ev.Uint64("conn", req.ID).Str("client", req.Client.String()).Str("vip", req.VIP.String())
		if req.Service != nil {
			ev = ev.Str("service", req.Service.Name)
		}
	}
	ev.Msg("panic in a connection; that connection was closed")
}

// Admit is the netstack admission hook: policy limits first (virtual server,
// class chain, instance), then the balancer. It runs once the client's handshake has completed, and
// returns the connection's session, which holds what admission reserved and
// hears how the connection ends.
func (a *Appliance) Admit(req *netstack.ConnRequest) (netstack.Decision, netstack.Session) {
	now := a.now()
	s := &session{a: a, req: req, start: now}
	if a.draining.Load() {
		a.counters.refusedDraining.Add(1)
		return netstack.Decision{Verdict: netstack.RefuseRST, Reason: "draining"}, s
	}
	return a.admit(req, s, now)
}

// admit runs the policy limits and the balancer for a connection (tcp) or
// a request (http), whose session s is.
func (a *Appliance) admit(req *netstack.ConnRequest, s *session, now time.Time) (netstack.Decision, netstack.Session) {
	vs := req.Service
	ref, ok := a.adm.Admit(vs, &s.ticket)
	if !ok && req.Settle() {
		// The client's previous connection was over for it, its release
		// still on the way: check again.
		ref, ok = a.adm.Admit(vs, &s.ticket)
	}
	if !ok {
		a.counters.refusal(ref.Level.String(), ref.Limit.String())
		a.warnEvery("refuse:"+vs.Name+":"+ref.Limit.String(), now, func(e *zerolog.Event) {
			e.Str("service", vs.Name).Str("client", req.Client.String()).Msg("refused: " + ref.Error())
		})
		return refuse(vs, ref.Limit.String(), ref.Value, ref.Error()), s
	}
	b := a.balancer(vs.Name)
	if b == nil { // reloaded away between lookup and admission
		s.ticket.Release()
		return netstack.Decision{Verdict: netstack.RefuseRST, Reason: "virtual server " + vs.Name + " removed"}, s
	}
	// The datapath classified the connection when its SYN passed: its flow
	// holds the service's action, and binding it to the target makes the
	// target's meters count it. Its key's hash is the flow hash Maglev
	// needs (the same on every instance: see datapath.FlowKey.Hash).
	key := datapath.NewFlowKey(req.Client, req.VIP, datapath.ProtoTCP)
	s.hash = key.Hash()
	s.flow = a.engine.Flow(req.Client, req.VIP, datapath.ProtoTCP)
	lease, err := b.PickAction(now, s.hash, s.action(), &s.tried)
	if err != nil && req.Settle() {
		lease, err = b.PickAction(now, s.hash, s.action(), &s.tried)
	}
	if err != nil {
		s.ticket.Release()
		return a.noTarget(vs, req, err, now), s
	}
	s.lease = lease
	s.counted = true
	a.open.Add(1)
	if s.http != nil {
		s.inflight = lease.Name()
		a.reqs.begin(vs.Name, s.inflight)
	}
	return s.accept(), s
}

// session is one connection's netstack.Session: what admission reserved for
// it (an admission ticket, a balancer lease and the targets it tried), the
// datapath flow it arrived on. The forwarder calls it from the connection's
// goroutine only, so its fields need no lock.
type session struct {
	a      *Appliance
	req    *netstack.ConnRequest
	start  time.Time
	flow   *datapath.Flow // nil when the flow table refused the flow
	hash   uint64         // the flow key's hash, for Maglev
	ticket policy.Ticket
	lease  balancer.Lease
	tried  balancer.Tried
	// counted is set while the session is in Appliance.open: from an
	// admitted pick to End.
	counted bool
	// http is the request of an http service's session (one per request,
	// see httpadmit.go); nil for a tcp connection's.
	http     *netstack.Request
	inflight string // the target the request counts in flight at
}

// action is the policy action the datapath classified the connection into,
// nil for none: the balancer picks on that service level's weights.
func (s *session) action() *policy.Action {
	if s.flow == nil {
		return nil
	}
	return s.flow.Action
}

// accept answers with the session's lease and binds the datapath flow to
// the lease's target.
func (s *session) accept() netstack.Decision {
	d := netstack.Decision{Verdict: netstack.Accept, Target: keepPort(s.lease.Target(), s.req.VIP.Port())}
	if f := s.flow; f != nil {
		d.Action = f.Action
		// The target's index in the meters' config: -1 when the lease
		// comes from another config than the meters' (a reload between
		// the two), and a flow of an older generation is reclassified on
		// its next packet; neither is bound, rather than bound wrong.
		m := s.a.engine.Meters()
		if id := m.Config().TargetIndex(s.lease.Target()); id >= 0 && uint64(f.Gen) == s.a.engine.Generation() {
			f.Bind(id)
		}
	}
	return d
}

// refuse answers a refusal the way the service speaks: an http service gets
// the 503 page naming the limit, a tcp one RST.
func refuse(vs *policy.VirtualServer, limit string, value int64, reason string) netstack.Decision {
	v := netstack.RefuseRST
	if vs.Proto == policy.ProtoHTTP {
		v = netstack.Refuse503
	}
	return netstack.Decision{Verdict: v, Limit: limit, Value: value, Reason: reason}
}

func (a *Appliance) noTarget(vs *policy.VirtualServer, req *netstack.ConnRequest, err error, now time.Time) netstack.Decision {
	a.counters.refusal("balancer", "targets")
	var value int64
	var nte *balancer.NoTargetError
	if errors.As(err, &nte) {
		value = int64(len(nte.Reasons) + nte.More)
	}
	a.errorEvery("notarget:"+vs.Name, now, func(e *zerolog.Event) {
		e.Str("service", vs.Name).Str("client", req.Client.String()).Msg("no target can serve: " + err.Error())
	})
	return refuse(vs, "targets", value, err.Error())
}

// DialFailed marks the failed target down for the retry interval and asks
// the balancer for another, excluding those tried; the tried-set's
// MaxAttempts is the only bound, so a target is marked down only when it
// was dialed and failed.
func (s *session) DialFailed(failed netstack.Decision, err error) netstack.Decision {
	a, req, vs := s.a, s.req, s.req.Service
	now := a.now()
	name := s.lease.Name()
	s.lease.Failed(now)
	a.counters.dialFailures.Add(1)
	a.warnEvery("dial:"+vs.Name+":"+name, now, func(e *zerolog.Event) {
		e.Str("service", vs.Name).Str("target", name).Err(err).Msg("target connect failed; marked down for the retry interval")
	})
	if b := a.balancer(vs.Name); b != nil {
		lease, perr := b.PickAction(now, s.hash, s.action(), &s.tried)
		if perr == nil {
			s.lease = lease
			if s.http != nil && s.counted {
				a.reqs.end(vs.Name, s.inflight)
				s.inflight = lease.Name()
				a.reqs.begin(vs.Name, s.inflight)
			}
			return s.accept()
		}
		err = perr
	}
	s.ticket.Release() // refused: the admission slot is free now
	return a.noTarget(vs, req, err, now)
}

// TargetFailed marks a target that went silent after its dial succeeded
// (the first-byte timeout) down for the retry interval, as a failed dial
// is: passive health.
func (s *session) TargetFailed(d netstack.Decision, err error) {
	a, vs := s.a, s.req.Service
	now := a.now()
	name := s.lease.Name()
	s.lease.Failed(now) // weir_forwarder_target_timed_out_total counts it
	a.warnEvery("firstbyte:"+vs.Name+":"+name, now, func(e *zerolog.Event) {
		e.Str("service", vs.Name).Str("target", name).Err(err).Msg("target sent nothing in time; marked down for the retry interval")
	})
}

// Released gives the target slot and the admission ticket back as soon as
// the client is done with the connection (netstack.Releaser): a client that
// reconnects at once finds them free, whatever weir's teardown still does.
// The forwarder calls it before End and never concurrently with another
// Session call, so the lease needs no lock.
func (s *session) Released() {
	s.lease.Release()
	s.ticket.Release()
}

// End releases the connection's target slot and admission ticket (if
// Released has not) and writes its access-log line, whose outcome is the
// forwarder's account of the end.
func (s *session) End(e *netstack.End) {
	a := s.a
	s.Released()
	if s.counted {
		s.counted = false
		a.open.Add(-1)
		if s.http != nil {
			a.reqs.end(s.req.Service.Name, s.inflight)
		}
	}
	if e.Request != nil {
		a.requestEnd(s, e)
		return
	}
	if e.Decision.Verdict == netstack.Accept {
		a.counters.closed.Add(1)
	}
	if a.opts.Access == nil {
		return
	}
	req := s.req
	r := obs.AccessRecord{
		Start: s.start, Client: req.Client.String(), VIP: req.VIP.String(), Service: req.Service.Name,
		Target: e.Stats.Target, BytesIn: e.Stats.TargetLeg.BytesSent, BytesOut: e.Stats.ClientLeg.BytesSent,
		Duration: a.now().Sub(s.start), Outcome: e.Outcome.String(), Reason: e.Decision.Reason,
	}
	switch e.Outcome {
	case netstack.RefusedReset, netstack.RefusedPage:
		// For an http service the request line and 503 with the page's
		// size, as the WebSphere plug-in's web server logs it.
		r.Target, r.BytesIn = "", 0
		r.BytesOut = uint64(e.Refusal.Bytes)
		r.RequestLine, r.Status = e.Refusal.RequestLine, e.Refusal.Status
	case netstack.HandshakeFailed, netstack.HandshakeTimedOut, netstack.Aborted, netstack.TargetTimedOut, netstack.Panicked:
		if e.Err != nil {
			r.Reason = e.Err.Error()
		}
	}
	a.opts.Access.Log(r)
}

// warnEvery and errorEvery write a line at most once per second per key,
// saying how many were held back since.
func (a *Appliance) warnEvery(key string, now time.Time, f func(*zerolog.Event)) {
	a.logEvery(zerolog.WarnLevel, key, now, f)
}

func (a *Appliance) errorEvery(key string, now time.Time, f func(*zerolog.Event)) {
	a.logEvery(zerolog.ErrorLevel, key, now, f)
}

func (a *Appliance) logEvery(level zerolog.Level, key string, now time.Time, f func(*zerolog.Event)) {
	if ok, n := a.limiter.Allow(key, now); ok {
		e := a.log.WithLevel(level)
		if n > 0 {
			e = e.Uint64("suppressed", n)
		}
		f(e)
	}
}

// sortedServices returns the names of cfg's services in file order.
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
