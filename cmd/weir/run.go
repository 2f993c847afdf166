package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/rs/zerolog"
	"github.com/spf13/cobra"

	"weir/cmd/weir/api"
	"weir/cmd/weir/internal/admin"
	"weir/cmd/weir/internal/appliance"
	"weir/cmd/weir/internal/host"
	"weir/cmd/weir/internal/metrics"
	"weir/cmd/weir/internal/obs"
	"weir/cmd/weir/internal/ui"
	"weir/datapath"
	"weir/datapath/tun"
	"weir/policy"
	"weir/policy/config"
)

// adminTokenEnv names the environment variable that may carry the admin
// token (never shown by --help).
const adminTokenEnv = "WEIR_ADMIN_TOKEN"

// runOptions are weir run's flags.
type runOptions struct {
	config     string
	tunName    string
	mtu        int
	queues     int
	tunAddrs   []string
	admin      admin.Options
	tokenFile  string
	logFormat  string
	logLevel   string
	accessLog  string
	accessCLF  bool
	grace      time.Duration
	readyFile  string
	user       string
	capture    string
	captureMax int64
	history    int
	offload    string
	backAddrs  []string    // see backarm.go
	memLimit   memoryLimit // see hostflags.go
	procs      procsFlag   // see hostflags.go
}

func newRunCmd() *cobra.Command {
	var o runOptions
	cmd := &cobra.Command{
		Use:   "run -c FILE",
		Short: "run the appliance on a TUN device (root)",
		Long: "run creates the TUN device, routes every VIP of the config through it, and serves the\n" +
			"virtual servers: datapath → userspace TCP stack → admission (QoS limits) → balancer →\n" +
			"splice to the targets. It runs the QoS sampler and the admin API (/status,\n" +
			"/connections, /metrics, /healthz, /history and the status page /ui). SIGHUP reloads the config (also every\n" +
			"balancer.refreshInterval when the file changed); SIGTERM or SIGINT stops accepting,\n" +
			"drains open connections for up to --grace, and exits 0.\n\n" +
			"Once the TUN, its routes and the listeners are set up, run keeps only CAP_NET_ADMIN\n" +
			"(reloads change routes): with --user it also becomes that user.\n\n" +
			"The admin token comes from --admin-token-file or $" + adminTokenEnv + ", never from the\n" +
			"command line, where every user of the host can read it.\n\n" +
			"Exit status: 0 after a clean stop, 1 for a usage or config error (nothing was\n" +
			"started), 2 for a runtime failure (no root, the TUN or the admin port cannot be had).",
		Example: "  sudo weir run -c examples/websphere-cluster.yaml\n" +
			"  sudo weir run -c weir.yaml --tun weir0 --queues 2 --admin 127.0.0.1:9090 --user weir\n" +
			"  sudo weir run -c weir.yaml --admin 0.0.0.0:9090 --admin-token-file /etc/weir/token\n" +
			"  sudo weir run -c weir.yaml --capture front.pcap --capture-max 10MB",
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if o.config == "" && len(args) == 1 {
				o.config = args[0]
			}
			if err := o.check(cmd); err != nil {
				return usageErr(err)
			}
			return runAppliance(cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr(), o)
		},
	}
	f := cmd.Flags()
	f.StringVarP(&o.config, "config", "c", "", "config `FILE` (YAML or Policy Agent); with --user it must stay readable by that user for reloads")
	f.StringVar(&o.tunName, "tun", "weir0", "TUN interface `NAME`: 1 to 15 bytes, no '/', ':' or space")
	f.IntVar(&o.mtu, "mtu", 1500, "TUN MTU in bytes (576..65535)")
	f.IntVar(&o.queues, "queues", tun.DefaultQueues(), "TUN queues, one datapath worker each (≥ 1; default one per two CPU cores, at most 8)")
	f.StringSliceVar(&o.tunAddrs, "tun-addr", nil, "address `PREFIX` for the TUN interface (repeatable); the VIPs are routed through it either way")
	f.StringVar(&o.admin.Addr, "admin", admin.DefaultAddr, "admin API `HOST:PORT`; a non-loopback address needs a token (--admin-token-file)")
	f.StringVar(&o.tokenFile, "admin-token-file", "", "read the bearer token the admin API requires from `FILE` (default: $"+adminTokenEnv+" if set)")
	f.StringVar(&o.admin.Token, "admin-token", "", "bearer `TOKEN` on the command line, readable by every user in /proc (deprecated)")
	f.MarkDeprecated("admin-token", "every user can read it in /proc/PID/cmdline; use --admin-token-file or $"+adminTokenEnv)
	f.BoolVar(&o.admin.Pprof, "pprof", false, "serve /debug/pprof on the admin API")
	f.StringVar(&o.logFormat, "log-format", "", "json or console (default: console on a terminal, else json)")
	f.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	f.StringVar(&o.accessLog, "access-log", "", "write one line per connection to `FILE` (- for stdout)")
	f.BoolVar(&o.accessCLF, "access-clf", false, "access log in Common Log Format instead of JSON")
	f.DurationVar(&o.grace, "grace", 30*time.Second, "how long SIGTERM waits for open connections to finish")
	f.StringVar(&o.readyFile, "ready-file", "", "write the admin address to `FILE` once serving (for scripts and tests)")
	f.StringVar(&o.user, "user", "", "after setup, run as `USER` (a name or a numeric uid) with only CAP_NET_ADMIN")
	f.StringVar(&o.capture, "capture", "", "record what the front NIC sees (both directions) to the pcap `FILE` (mode 0600; tcpdump -r, Wireshark)")
	f.IntVar(&o.history, "history", ui.DefaultSamples, "`SAMPLES` (sampling intervals) kept per series for /history and the status page /ui; each target's series costs "+
		strconv.Itoa(ui.TargetSampleBytes)+" bytes a sample")
	o.captureMax = defaultCaptureMax
	f.Var(byteSize{&o.captureMax}, "capture-max", "stop recording once the capture holds this many `BYTES` (suffixes kB, MB, GB, KiB, MiB, GiB)")
	f.StringVar(&o.offload, "offload", "auto", "TUN segmentation offload: on (64 KiB TCP segments through the datapath and the stack), off (one packet per read), auto (on when the kernel allows it)")
	o.memLimit = memoryLimit{auto: true}
	f.Var(&o.memLimit, "memory-limit", "soft limit on the Go runtime's memory: the GC works harder as it nears it (auto: "+
		strconv.Itoa(int(host.AutoLimitFraction*100))+" % of the cgroup's memory limit, none without one; none; or `BYTES` like 512MiB); $GOMEMLIMIT wins. "+
		"The GC target is GOGC="+strconv.Itoa(host.DefaultGOGC)+" unless $GOGC is set")
	f.Var(&o.procs, "procs", "CPUs weir's Go code uses at once (GOMAXPROCS): auto (half the CPUs, at least 1: the kernel's side of every packet weir moves runs on the others) or a `COUNT`; $GOMAXPROCS wins")
	f.StringSliceVar(&o.backAddrs, "back-addr", nil, backAddrUsage)
	return cmd
}

// check validates the flags that need no system call: each error names
// the flag and what it accepts.
func (o *runOptions) check(cmd *cobra.Command) error {
	if o.config == "" {
		return errors.New("run: no config file (give -c FILE)")
	}
	if err := tun.ValidName(o.tunName); err != nil {
		return fmt.Errorf("--tun: %w", err)
	}
	if _, err := tun.ParseOffload(o.offload); err != nil {
		return fmt.Errorf("--offload: %w", err)
	}
	if o.capture != "" && o.offload == "on" {
		return errors.New("--capture records packets up to the MTU: give --offload off or auto with it")
	}
	if o.queues < 1 {
		return fmt.Errorf("--queues %d: want at least 1", o.queues)
	}
	if o.mtu < 576 || o.mtu > 65535 {
		return fmt.Errorf("--mtu %d: want 576..65535", o.mtu)
	}
	if o.grace < 0 {
		return fmt.Errorf("--grace %v: want a duration ≥ 0", o.grace)
	}
	if o.history < 0 || o.history > 1<<20 {
		return fmt.Errorf("--history %d: want 1..%d samples (0: %d)", o.history, 1<<20, ui.DefaultSamples)
	}
	if o.captureMax < 1<<10 {
		return fmt.Errorf("--capture-max %d: want at least 1KiB", o.captureMax)
	}
	if cmd.Flags().Changed("capture-max") && o.capture == "" {
		return errors.New("--capture-max needs --capture FILE")
	}
	if o.tokenFile != "" && o.admin.Token != "" {
		return errors.New("--admin-token-file and --admin-token both given: keep --admin-token-file")
	}
	switch {
	case o.tokenFile != "":
		tok, err := readToken(o.tokenFile)
		if err != nil {
			return fmt.Errorf("--admin-token-file: %w", err)
		}
		o.admin.Token = tok
	case o.admin.Token == "":
		o.admin.Token = os.Getenv(adminTokenEnv)
	}
	if err := admin.CheckAddr(o.admin.Addr, o.admin.Token); err != nil {
		return err
	}
	for _, s := range o.tunAddrs {
		if _, err := netip.ParsePrefix(s); err != nil {
			return fmt.Errorf("--tun-addr %q: %w", s, err)
		}
	}
	return nil
}

// readToken reads an admin token file: its first line, without surrounding
// white space, must not be empty.
func readToken(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	tok, _, _ := strings.Cut(string(b), "\n")
	tok = strings.TrimSpace(tok)
	if tok == "" {
		return "", fmt.Errorf("%s holds no token (its first line is empty)", path)
	}
	return tok, nil
}

// preflight reports, before anything is created, what would stop weir run,
// each with what to do about it.
func preflight() error {
	if os.Geteuid() != 0 && !host.HaveNetAdmin() {
		return errors.New("weir run needs root (CAP_NET_ADMIN) to create its TUN device: run it with sudo " +
			"(--user drops to another user once it is set up).\nTo see weir work without root, run `weir demo`")
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		return fmt.Errorf("no /dev/net/tun (%v): load the tun module (modprobe tun), or give the container the device (--device /dev/net/tun)", err)
	}
	return nil
}

// runAppliance runs weir until ctx ends or a signal stops it. Its errors
// are runtime failures (exit 2) except where marked as config errors.
func runAppliance(ctx context.Context, stdout, stderr io.Writer, o runOptions) error {
	mem := host.DecideMemory(o.memLimit.limit(), os.Getenv, host.CgroupMemoryLimit())
	host.ApplyMemory(mem)
	procs := host.DecideProcs(o.procs.n, os.Getenv, runtime.GOMAXPROCS(0))
	host.ApplyProcs(procs)
	cfg, err := config.Load(o.config)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return &exitError{code: 1}
	}
	var drop *host.DropPlan
	if o.user != "" {
		if drop, err = host.PlanDrop(o.user); err != nil {
			return usageErr(fmt.Errorf("--user: %w", err))
		}
	}
	if err := preflight(); err != nil {
		return err
	}
	backs, backRoutes, err := backArm(cfg, o.backAddrs)
	if err != nil {
		return err
	}

	logs, err := obs.New(obs.Options{Format: o.logFormat, Level: o.logLevel, Output: stderr})
	if err != nil {
		return usageErr(err)
	}
	defer logs.Close()
	log := logs.Logger
	access, closeAccess, err := openAccessLog(o, stdout)
	if err != nil {
		return err
	}
	defer closeAccess()
	// The ready file is created now, while weir may still write where it
	// likes, and filled once it serves (perhaps as --user by then).
	var ready *os.File
	if o.readyFile != "" {
		if ready, err = os.OpenFile(o.readyFile, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644); err != nil {
			return fmt.Errorf("ready file: %w", err)
		}
		defer ready.Close()
	}

	// The admin port is bound before the TUN exists, so that "address in
	// use" stops weir before it touches the network.
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	src := &lateSource{}
	rec := ui.NewRecorder(o.history)
	o.admin.History = rec.History
	srv, err := admin.Listen(o.admin, src, reg)
	if err != nil {
		return err
	}
	front, err := openFront(o, cfg, backRoutes)
	if err != nil {
		srv.Shutdown(context.Background())
		return err
	}
	if front.capture != nil {
		defer front.capture.Close() // once: a start that fails still flushes it
	}
	hostCap, hostWhy := openHostCapture(&log, cfg)
	if hostCap != nil {
		defer hostCap.Close() // after the appliance's Close
	}
	app, err := appliance.New(appliance.Options{
		Config: cfg, Source: o.config, HostCapture: hostCap, HostCaptureWhy: hostWhy,
		Front: front.devices[0], FrontQueues: front.devices[1:], Backs: backs,
		Log: &log, Access: access, LogDrops: logs.Dropped,
		OnSample: rec.Record,
	})
	if err != nil {
		front.Close()
		srv.Shutdown(context.Background())
		return usageErr(err)
	}
	// weir's own metrics beside the Go and process ones, once there is a
	// status to read them from.
	reg.MustRegister(metrics.NewCollector(app.Status))
	src.set(app)
	app.Start()
	// Memory a load took goes back to the OS once the load is over.
	go host.TrimLoop(ctx, host.TrimOptions{Trimmed: func(before, after host.HeapFigures, quiet bool) {
		log.Info().Uint64("heap_mib", before.Live>>20).Uint64("free_mib", before.Free>>20).Bool("quiet", quiet).
			Uint64("heap_after_mib", after.Live>>20).Msg("free heap returned to the OS")
	}})
	go func() {
		if err := srv.Serve(); err != nil {
			log.Error().Err(err).Msg("admin API stopped")
		}
	}()

	// Everything that needs privileges is set up: keep CAP_NET_ADMIN (the
	// reloads' route changes) and drop the rest.
	if err := dropAndSay(&log, drop, o.user); err != nil {
		app.Close()
		srv.Shutdown(context.Background())
		return err
	}

	reloader := NewReloader(app, o.config, config.Parser{}.Parse)
	reloader.OnReload = func(cfg *policy.Config) {
		// The back arm is up from the start; its host routes follow the
		// netstack targets of each configuration (see backArm).
		routes := backRoutesFor(cfg, backs, len(o.backAddrs) > 0)
		if err := front.tuns[0].SyncRoutes(append(tun.VIPRoutes(cfg), routes...)); err != nil {
			log.Error().Err(err).Msg("routing the new VIPs through the TUN failed")
		}
		for _, fam := range host.ForwardingOff(routes) {
			log.Warn().Str("forwarding", fam).Msg("forwarding is off: the back arm's packets to via: netstack targets cannot leave this host (sysctl net.ipv4.ip_forward=1)")
		}
	}
	hup := make(chan struct{}, 1)
	stop := make(chan struct{})
	go reloader.Loop(hup, stop)
	// Signals are caught from here on: a SIGTERM sent as soon as the ready
	// file is filled drains rather than kills.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGHUP, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sigs)

	for _, fam := range host.ForwardingOff(backRoutes) {
		log.Warn().Str("forwarding", fam).Msg("forwarding is off: the back arm's packets to via: netstack targets cannot leave this host (sysctl net.ipv4.ip_forward=1)")
	}
	ev := log.Info().Str("tun", o.tunName).Int("queues", len(front.tuns)).Str("offload", o.offload).Bool("offload_active", front.tuns[0].Offload()).Str("admin", srv.Addr()).
		Int("services", len(cfg.Services)).Str("config", o.config).
		Int("gogc", mem.GOGC).Str("gogc_from", mem.GOGCFrom).Str("memory_limit", limitText(mem)).Str("memory_limit_from", mem.LimitFrom).
		Int("gomaxprocs", procs.N).Str("gomaxprocs_from", procs.From)
	if front.capture != nil {
		ev = ev.Str("capture", o.capture).Int64("capture_max", o.captureMax)
	}
	ev.Msg("weir running")
	if ready != nil {
		if _, err := ready.WriteString(srv.Addr() + "\n"); err != nil {
			log.Error().Err(err).Msg("ready file")
		}
		ready.Close()
	}

	waitForStop(ctx, &log, sigs, hup, app, o.grace)
	close(stop)
	return stopAppliance(&log, o, app, srv, front)
}

// stopAppliance drains the open connections for the grace period, stops
// the admin API and closes the appliance and the capture.
func stopAppliance(log *zerolog.Logger, o runOptions, app *appliance.Appliance, srv *admin.Server, front *frontEnd) error {
	dctx, cancel := context.WithTimeout(context.Background(), o.grace)
	left := app.Drain(dctx)
	cancel()
	if left > 0 {
		log.Warn().Int("open", left).Msg("grace period over: closing the remaining connections")
	}
	sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	srv.Shutdown(sctx)
	cancel()
	err := app.Close()
	if front.capture != nil {
		st := front.capture.Close()
		log.Info().Str("capture", o.capture).Uint64("packets", st.Recorded).Uint64("not_recorded", st.Missed).
			Int64("bytes", st.Bytes).Msg("capture closed")
	}
	log.Info().Msg("weir stopped")
	return err
}

// openAccessLog opens --access-log ("-": stdout); the returned func flushes
// and closes it. Without --access-log there is none (nil) and close does
// nothing.
func openAccessLog(o runOptions, stdout io.Writer) (*obs.AccessLog, func(), error) {
	if o.accessLog == "" {
		return nil, func() {}, nil
	}
	w, closeFile := stdout, func() {}
	if o.accessLog != "-" {
		f, err := os.OpenFile(o.accessLog, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return nil, nil, fmt.Errorf("access log: %w", err)
		}
		w, closeFile = f, func() { f.Close() }
	}
	access := obs.NewAccessLog(w, o.accessCLF)
	return access, func() { access.Flush(); closeFile() }, nil
}

// frontEnd is the appliance's front: the TUN queues, as datapath devices
// (wrapped by the --capture recorder when there is one).
type frontEnd struct {
	tuns    []*tun.Device
	devices []datapath.Device
	capture *frontCapture // nil without --capture
}

// openFront opens the TUN with its VIP and back-arm routes and, with
// --capture, starts recording what crosses it.
func openFront(o runOptions, cfg *policy.Config, backRoutes []netip.Prefix) (*frontEnd, error) {
	var addrs []netip.Prefix
	for _, s := range o.tunAddrs {
		addrs = append(addrs, netip.MustParsePrefix(s)) // checked by o.check
	}
	offload, _ := tun.ParseOffload(o.offload) // checked by o.check
	if o.capture != "" {
		offload = tun.OffloadOff // the capture wrapper passes no super-packets
	}
	devs, err := tun.Open(tun.Options{Name: o.tunName, MTU: o.mtu, Queues: o.queues, Addrs: addrs, Routes: append(tun.VIPRoutes(cfg), backRoutes...), Offload: offload})
	if err != nil {
		return nil, fmt.Errorf("TUN %s: %w", o.tunName, err)
	}
	fe := &frontEnd{tuns: devs, devices: make([]datapath.Device, len(devs))}
	for i, d := range devs {
		fe.devices[i] = d
	}
	if o.capture != "" {
		if fe.capture, err = startCapture(o.capture, o.captureMax, fe.devices); err != nil {
			fe.Close()
			return nil, err
		}
		fe.devices = fe.capture.fronts
	}
	return fe, nil
}

// Close closes the front's devices; it is for a start that failed (once
// the appliance runs, the appliance owns and closes them).
func (fe *frontEnd) Close() {
	for _, d := range fe.devices {
		d.Close()
	}
}

// dropAndSay drops the privileges weir no longer needs (to --user's
// account with drop) and logs what it kept. Without --user a failure only
// warns; with it, it is the error.
func dropAndSay(log *zerolog.Logger, drop *host.DropPlan, user string) error {
	if err := host.DropPrivileges(drop); err != nil {
		if drop != nil {
			return fmt.Errorf("--user %s: %w", user, err)
		}
		log.Warn().Err(err).Msg("capabilities not dropped: weir keeps every privilege it started with")
		return nil
	}
	ev := log.Info().Str("capabilities", "cap_net_admin")
	if drop != nil {
		ev = ev.Str("user", user).Int("uid", drop.UID)
	}
	ev.Msg("privileges dropped")
	return nil
}

// waitForStop serves signals until ctx ends or SIGTERM/SIGINT arrives:
// SIGHUP asks the reloader (hup) for a reload and waiting goes on.
func waitForStop(ctx context.Context, log *zerolog.Logger, sigs <-chan os.Signal, hup chan<- struct{}, app *appliance.Appliance, grace time.Duration) {
	for {
		select {
		case <-ctx.Done():
			return
		case s := <-sigs:
			if s == syscall.SIGHUP {
				log.Info().Msg("SIGHUP: reloading the configuration")
				select {
				case hup <- struct{}{}:
				default:
				}
				continue
			}
			log.Info().Str("signal", s.String()).Dur("grace", grace).Int("open", app.OpenConnections()).Msg("draining")
			return
		}
	}
}

// lateSource lets the admin API listen before the appliance exists: until
// then /healthz says so and the rest answers empty.
type lateSource struct {
	app atomic.Pointer[appliance.Appliance]
}

func (l *lateSource) set(a *appliance.Appliance) { l.app.Store(a) }

func (l *lateSource) Status() api.Status {
	if a := l.app.Load(); a != nil {
		return a.Status()
	}
	return api.Status{}
}

func (l *lateSource) Connections() []api.Connection {
	if a := l.app.Load(); a != nil {
		return a.Connections()
	}
	return []api.Connection{}
}

func (l *lateSource) Healthy() error {
	if a := l.app.Load(); a != nil {
		return a.Healthy()
	}
	return errors.New("starting")
}
