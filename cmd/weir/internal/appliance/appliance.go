// Package appliance wires weir's parts into one running product:
//
//	front Device ──► datapath.Engine ──► netstack.Stack (front NIC)
//	   ──► Forwarder ──► Admit: policy.Admission (limits) ──► balancer.Pick
//	   ──► dial (host socket | back NIC) ──► splice ──► Closed: release
//
// and runs the control loops around them: the recompute loop (every
// RecomputeInterval: meters → admission bandwidth windows, limit events →
// the error log) and the sampling loop (every SamplingInterval: per-target
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
	"hash/fnv"
	"net"
	"net/netip"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"weir/balancer"
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

	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// BackArm is one back NIC.
type BackArm struct {
	Name   string // for errors and stats; "" means back<i>
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
	backs  []*netstack.NIC
	fwd    *netstack.Forwarder

	checkMu  sync.Mutex                    // guards checks
	checks   map[string]context.CancelFunc // health checker per service, while running
	conns    sync.Map                      // connection ID → *connState
	draining atomic.Bool

	explMu sync.Mutex
	expl   []policy.Explanation // last sampling interval's, by service then target
	explAt time.Time

	counters counters
	skipMu   sync.Mutex
	skipped  map[policy.TargetKey]uint64 // SkippedAtLimit already warned about
	totals   datapath.MeterTotals        // recompute loop only
	limiter  obs.Limiter

	stop chan struct{}
	wg   sync.WaitGroup
}

type reloadError struct {
	At  time.Time
	Err string
}

// connState is what the appliance holds for one admitted connection.
type connState struct {
	ticket policy.Ticket
	lease  balancer.Lease
	tried  balancer.Tried
	start  time.Time
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

	a.engine = datapath.NewEngine(opts.Front, cfg, datapath.EngineOptions{Workers: 1 + len(opts.FrontQueues)})

	a.stack, err = netstack.New(opts.Stack)
	if err != nil {
		return nil, err
	}
	a.front, err = a.stack.AddNIC(a.engine, netstack.NICOptions{Name: "front", Promiscuous: true})
	if err != nil {
		a.stack.Close()
		return nil, err
	}
	for i, q := range opts.FrontQueues {
		name := fmt.Sprintf("front%d", i+1)
		if _, err := a.stack.AddNIC(a.engine.Attach(q, i+1), netstack.NICOptions{Name: name, Promiscuous: true}); err != nil {
			a.stack.Close()
			return nil, fmt.Errorf("front queue %d: %w", i+1, err)
		}
	}
	fo := opts.Forwarder
	fo.Services = a.service
	fo.Admitter = a
	for i, arm := range opts.Backs {
		name := arm.Name
		if name == "" {
			name = fmt.Sprintf("back%d", i)
		}
		routes := append([]netip.Prefix(nil), arm.Routes...)
		for _, p := range arm.Addrs {
			routes = append(routes, p.Masked())
		}
		nic, err := a.stack.AddNIC(arm.Device, netstack.NICOptions{Name: name, Addrs: arm.Addrs, Routes: routes})
		if err != nil {
			a.stack.Close()
			return nil, fmt.Errorf("back arm %s: %w", name, err)
		}
		a.backs = append(a.backs, nic)
		fo.Back = &netstack.StackDialer{Stack: a.stack}
	}
	a.fwd = netstack.NewForwarder(a.stack, fo)
	if opts.Registerer != nil {
		if err := opts.Registerer.Register(&collector{a: a}); err != nil {
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

// Start runs the recompute and sampling loops until Close.
func (a *Appliance) Start() {
	a.wg.Add(2)
	go a.recomputeLoop()
	go a.sampleLoop()
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
		c := &balancer.Checker{Balancer: b, Dial: a.checkDial, Now: a.now}
		a.wg.Go(func() { c.Loop(ctx) })
	}
}

// checkDial connects a health check to a target the way its connections
// go: through the back arm for `via: netstack` targets, else a host socket.
func (a *Appliance) checkDial(ctx context.Context, network, address string) (net.Conn, error) {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return nil, err
	}
	for _, vs := range a.cfg.Load().Services {
		for _, t := range vs.Targets {
			if t.Addr == ap && t.Via == policy.DialNetstack {
				return a.stack.DialTCP(ctx, netip.AddrPort{}, ap)
			}
		}
	}
	var d net.Dialer
	return d.DialContext(ctx, network, address)
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

// OpenConnections is the number of admitted connections not yet closed.
func (a *Appliance) OpenConnections() int {
	n := 0
	a.conns.Range(func(_, _ any) bool { n++; return true })
	return n
}

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
	a.wg.Wait()
	err := a.fwd.Close()
	if e := a.stack.Close(); err == nil {
		err = e
	}
	return err
}

// flowHash hashes a connection's 4-tuple for Maglev. It is FNV-1a, the same
// in every weir instance, so instances behind ECMP agree on a flow's target.
func flowHash(client, vip netip.AddrPort) uint64 {
	h := fnv.New64a()
	b := client.Addr().As16()
	h.Write(b[:])
	b = vip.Addr().As16()
	h.Write(b[:])
	h.Write([]byte{byte(client.Port() >> 8), byte(client.Port()), byte(vip.Port() >> 8), byte(vip.Port())})
	return h.Sum64()
}

// Admit is the netstack admission hook: policy limits first (virtual server,
// class chain, instance), then the balancer. It runs before any SYN-ACK.
func (a *Appliance) Admit(req *netstack.ConnRequest) netstack.Decision {
	vs := req.Service
	now := a.now()
	if a.draining.Load() {
		a.counters.refusedDraining.Add(1)
		return netstack.Decision{Verdict: netstack.RefuseRST, Reason: "draining"}
	}
	st := &connState{start: now}
	if ref, ok := a.adm.Admit(vs, &st.ticket); !ok {
		a.counters.refusal(ref.Level.String(), ref.Limit.String())
		a.warnEvery("refuse:"+vs.Name+":"+ref.Limit.String(), now, func(e *zerolog.Event) {
			e.Str("service", vs.Name).Str("client", req.Client.String()).Msg("refused: " + ref.Error())
		})
		return refuse(vs, ref.Limit.String(), ref.Value, ref.Error())
	}
	b := a.balancer(vs.Name)
	if b == nil { // reloaded away between lookup and admission
		st.ticket.Release()
		return netstack.Decision{Verdict: netstack.RefuseRST, Reason: "virtual server " + vs.Name + " removed"}
	}
	lease, err := b.PickExcept(now, flowHash(req.Client, req.VIP), &st.tried)
	if err != nil {
		st.ticket.Release()
		return a.noTarget(vs, req, err, now)
	}
	st.lease = lease
	a.conns.Store(req.ID, st)
	return a.accept(vs, req, &st.lease)
}

func (a *Appliance) accept(vs *policy.VirtualServer, req *netstack.ConnRequest, l *balancer.Lease) netstack.Decision {
	cfg := a.cfg.Load()
	action := cfg.Classify(6, req.VIP, req.Client, vs)
	// Bind the datapath flow to its target so the target's meters count it.
	if f := a.engine.Flow(req.Client, req.VIP, 6); f != nil {
		if m := a.engine.Meters(); m.Config() == cfg {
			if si, ti, ok := targetIndex(cfg, vs.Name, l.Name()); ok {
				f.Bind(m.TargetID(si, ti))
			}
		}
	}
	return netstack.Decision{Verdict: netstack.Accept, Target: l.Target(), Action: action}
}

// targetIndex finds a target's position in cfg: its service's index and its
// own index in that service.
func targetIndex(cfg *policy.Config, service, target string) (si, ti int, ok bool) {
	for si, vs := range cfg.Services {
		if vs.Name != service {
			continue
		}
		for ti, t := range vs.Targets {
			if t.Name == target {
				return si, ti, true
			}
		}
	}
	return 0, 0, false
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

// DialFailed marks the failed target down for the retry interval and tries
// another one, within the balancer's MaxAttempts.
func (a *Appliance) DialFailed(req *netstack.ConnRequest, failed netstack.Decision, err error) netstack.Decision {
	now := a.now()
	v, ok := a.conns.Load(req.ID)
	if !ok {
		return netstack.Decision{Verdict: netstack.RefuseRST, Reason: "connection state lost"}
	}
	st := v.(*connState)
	name := st.lease.Name()
	st.lease.Failed(now)
	a.counters.dialFailures.Add(1)
	a.warnEvery("dial:"+req.Service.Name+":"+name, now, func(e *zerolog.Event) {
		e.Str("service", req.Service.Name).Str("target", name).Err(err).Msg("target connect failed; marked down for the retry interval")
	})
	vs := req.Service
	if b := a.balancer(vs.Name); b != nil && !errors.Is(err, netstack.ErrDialAttempts) {
		lease, perr := b.PickExcept(now, flowHash(req.Client, req.VIP), &st.tried)
		if perr == nil {
			st.lease = lease
			return a.accept(vs, req, &st.lease)
		}
		err = perr
	}
	a.conns.Delete(req.ID)
	st.ticket.Release()
	return a.noTarget(vs, req, err, now) // the access line comes with Refused
}

// Closed releases the connection's target slot and admission ticket and
// writes its access-log line.
func (a *Appliance) Closed(req *netstack.ConnRequest, d netstack.Decision, final netstack.ConnStats) {
	v, ok := a.conns.LoadAndDelete(req.ID)
	if !ok {
		return
	}
	st := v.(*connState)
	st.lease.Release()
	st.ticket.Release()
	a.counters.closed.Add(1)
	a.access(req, final, "ok", "", st.start)
}

// Refused writes the access-log line of a refused connection: for an http
// service the request line and 503 with the page's size, as the WebSphere
// plug-in's web server logs it.
func (a *Appliance) Refused(req *netstack.ConnRequest, d netstack.Decision, r netstack.Refusal) {
	if a.opts.Access == nil {
		return
	}
	outcome := "reset"
	if r.Status == 503 {
		outcome = "503"
	}
	now := a.now()
	a.opts.Access.Log(obs.AccessRecord{
		Start: now, Client: req.Client.String(), VIP: req.VIP.String(), Service: req.Service.Name,
		BytesOut: uint64(r.Bytes), Outcome: outcome, Reason: d.Reason,
		RequestLine: r.RequestLine, Status: r.Status,
	})
}

func (a *Appliance) access(req *netstack.ConnRequest, s netstack.ConnStats, outcome, reason string, start time.Time) {
	if a.opts.Access == nil {
		return
	}
	a.opts.Access.Log(obs.AccessRecord{
		Start: start, Client: req.Client.String(), VIP: req.VIP.String(), Service: req.Service.Name,
		Target: s.Target, BytesIn: s.TargetLeg.BytesSent, BytesOut: s.ClientLeg.BytesSent,
		Duration: a.now().Sub(start), Outcome: outcome, Reason: reason,
	})
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
