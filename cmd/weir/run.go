package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"
	"github.com/vishvananda/netlink"

	"weir/cmd/weir/internal/admin"
	"weir/cmd/weir/internal/appliance"
	"weir/cmd/weir/internal/obs"
	"weir/datapath"
	"weir/datapath/tun"
	"weir/policy"
	"weir/policy/config"
)

// runOptions are weir run's flags.
type runOptions struct {
	config    string
	tunName   string
	mtu       int
	queues    int
	tunAddrs  []string
	admin     admin.Options
	logFormat string
	logLevel  string
	accessLog string
	accessCLF bool
	grace     time.Duration
	readyFile string
}

func newRunCmd() *cobra.Command {
	var o runOptions
	cmd := &cobra.Command{
		Use:   "run -c FILE",
		Short: "run the appliance on a TUN device (root)",
		Long: "run creates the TUN device, routes every VIP of the config through it, and serves the\n" +
			"virtual servers: datapath → userspace TCP stack → admission (QoS limits) → balancer →\n" +
			"splice to the targets. It runs the QoS sampler and the admin API (/status,\n" +
			"/connections, /metrics, /healthz). SIGHUP reloads the config (also every\n" +
			"balancer.refreshInterval when the file changed); SIGTERM or SIGINT stops accepting,\n" +
			"drains open connections for up to --grace, and exits 0.",
		Example: "  sudo weir run -c examples/websphere-cluster.yaml\n  sudo weir run -c weir.yaml --tun weir0 --queues 2 --admin 127.0.0.1:9090",
		RunE: func(cmd *cobra.Command, args []string) error {
			if o.config == "" && len(args) == 1 {
				o.config = args[0]
			}
			if o.config == "" {
				return errors.New("run: no config file (give -c FILE)")
			}
			return runAppliance(cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr(), o)
		},
	}
	f := cmd.Flags()
	f.StringVarP(&o.config, "config", "c", "", "config `FILE` (YAML or Policy Agent)")
	f.StringVar(&o.tunName, "tun", "weir0", "TUN interface `NAME`")
	f.IntVar(&o.mtu, "mtu", 1500, "TUN MTU in bytes")
	f.IntVar(&o.queues, "queues", 1, "TUN queues, one datapath worker each")
	f.StringSliceVar(&o.tunAddrs, "tun-addr", nil, "address `PREFIX` for the TUN interface (repeatable); the VIPs are routed through it either way")
	f.StringVar(&o.admin.Addr, "admin", admin.DefaultAddr, "admin API `HOST:PORT`; a non-loopback address needs --admin-token")
	f.StringVar(&o.admin.Token, "admin-token", os.Getenv("WEIR_ADMIN_TOKEN"), "bearer `TOKEN` required by the admin API (default $WEIR_ADMIN_TOKEN)")
	f.BoolVar(&o.admin.Pprof, "pprof", false, "serve /debug/pprof on the admin API")
	f.StringVar(&o.logFormat, "log-format", "", "json or console (default: console on a terminal, else json)")
	f.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	f.StringVar(&o.accessLog, "access-log", "", "write one line per connection to `FILE` (- for stdout)")
	f.BoolVar(&o.accessCLF, "access-clf", false, "access log in Common Log Format instead of JSON")
	f.DurationVar(&o.grace, "grace", 30*time.Second, "how long SIGTERM waits for open connections to finish")
	f.StringVar(&o.readyFile, "ready-file", "", "write the admin address to `FILE` once serving (for scripts and tests)")
	return cmd
}

// preflight reports, before anything is created, what would stop weir run,
// each with what to do about it.
func preflight() error {
	if os.Geteuid() != 0 && !haveNetAdmin() {
		return errors.New("weir run needs root (CAP_NET_ADMIN) to create its TUN device: run it with sudo.\n" +
			"To see weir work without root, run `weir demo`")
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		return fmt.Errorf("no /dev/net/tun (%v): load the tun module (modprobe tun), or give the container the device (--device /dev/net/tun)", err)
	}
	return nil
}

func runAppliance(ctx context.Context, stdout, stderr io.Writer, o runOptions) error {
	if err := preflight(); err != nil {
		return err
	}
	cfg, err := config.Load(o.config)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return &exitError{code: 1}
	}
	var tunAddrs []netip.Prefix
	for _, s := range o.tunAddrs {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return fmt.Errorf("--tun-addr %q: %w", s, err)
		}
		tunAddrs = append(tunAddrs, p)
	}

	logs, err := obs.New(obs.Options{Format: o.logFormat, Level: o.logLevel, Output: stderr})
	if err != nil {
		return err
	}
	defer logs.Close()
	log := logs.Logger
	var access *obs.AccessLog
	if o.accessLog != "" {
		w := stdout
		if o.accessLog != "-" {
			f, err := os.OpenFile(o.accessLog, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
			if err != nil {
				return fmt.Errorf("access log: %w", err)
			}
			defer f.Close()
			w = f
		}
		access = obs.NewAccessLog(w, o.accessCLF)
		defer access.Flush()
	}

	// The admin port is bound before the TUN exists, so that "address in
	// use" stops weir before it touches the network.
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	var app *appliance.Appliance
	src := &lateSource{}
	srv, err := admin.Listen(o.admin, src, reg)
	if err != nil {
		return err
	}

	devs, err := tun.Open(tun.Options{Name: o.tunName, MTU: o.mtu, Queues: o.queues, Addrs: tunAddrs, Routes: vipRoutes(cfg)})
	if err != nil {
		srv.Shutdown(context.Background())
		return fmt.Errorf("TUN %s: %w", o.tunName, err)
	}
	var queues []datapath.Device
	for _, d := range devs[1:] {
		queues = append(queues, d)
	}
	app, err = appliance.New(appliance.Options{
		Config: cfg, Source: o.config,
		Front: devs[0], FrontQueues: queues,
		Log: &log, Access: access, Registerer: reg,
	})
	if err != nil {
		for _, d := range devs {
			d.Close()
		}
		srv.Shutdown(context.Background())
		return err
	}
	src.set(app)
	app.Start()
	go func() {
		if err := srv.Serve(); err != nil {
			log.Error().Err(err).Msg("admin API stopped")
		}
	}()

	reloader := appliance.NewReloader(app, o.config, config.Load)
	reloader.OnReload = func(cfg *policy.Config) {
		if err := syncRoutes(o.tunName, vipRoutes(cfg)); err != nil {
			log.Error().Err(err).Msg("routing the new VIPs through the TUN failed")
		}
	}
	hup := make(chan struct{}, 1)
	stop := make(chan struct{})
	go reloader.Loop(hup, stop)

	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGHUP, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sigs)

	log.Info().Str("tun", o.tunName).Int("queues", len(devs)).Str("admin", srv.Addr()).
		Int("services", len(cfg.Services)).Str("config", o.config).Msg("weir running")
	if o.readyFile != "" {
		if err := os.WriteFile(o.readyFile, []byte(srv.Addr()+"\n"), 0o644); err != nil {
			log.Error().Err(err).Msg("ready file")
		}
	}

	for {
		select {
		case <-ctx.Done():
		case s := <-sigs:
			if s == syscall.SIGHUP {
				log.Info().Msg("SIGHUP: reloading the configuration")
				select {
				case hup <- struct{}{}:
				default:
				}
				continue
			}
			log.Info().Str("signal", s.String()).Dur("grace", o.grace).Int("open", app.OpenConnections()).Msg("draining")
		}
		break
	}
	close(stop)
	dctx, cancel := context.WithTimeout(context.Background(), o.grace)
	left := app.Drain(dctx)
	cancel()
	if left > 0 {
		log.Warn().Int("open", left).Msg("grace period over: closing the remaining connections")
	}
	sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	srv.Shutdown(sctx)
	cancel()
	err = app.Close()
	log.Info().Msg("weir stopped")
	return err
}

// lateSource lets the admin API listen before the appliance exists: until
// then /healthz says so and the rest answers empty.
type lateSource struct {
	app atomic.Pointer[appliance.Appliance]
}

func (l *lateSource) set(a *appliance.Appliance) { l.app.Store(a) }

func (l *lateSource) Status() any {
	if a := l.app.Load(); a != nil {
		return a.Status()
	}
	return struct{}{}
}

func (l *lateSource) Connections() any {
	if a := l.app.Load(); a != nil {
		return a.Connections()
	}
	return []struct{}{}
}

func (l *lateSource) Healthy() error {
	if a := l.app.Load(); a != nil {
		return a.Healthy()
	}
	return errors.New("starting")
}

// vipRoutes are the host routes that send every VIP of cfg into the TUN.
func vipRoutes(cfg *policy.Config) []netip.Prefix {
	seen := map[netip.Addr]bool{}
	var out []netip.Prefix
	for _, vs := range cfg.Services {
		for _, v := range vs.VIPs {
			if v = v.Unmap(); !seen[v] {
				seen[v] = true
				out = append(out, netip.PrefixFrom(v, v.BitLen()))
			}
		}
	}
	return out
}

// syncRoutes makes the routes through the TUN named name exactly want: it
// adds the new VIPs' routes and removes those of VIPs gone in a reload.
func syncRoutes(name string, want []netip.Prefix) error {
	link, err := netlink.LinkByName(name)
	if err != nil {
		return err
	}
	have := map[netip.Prefix]netlink.Route{}
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		rs, err := netlink.RouteList(link, fam)
		if err != nil {
			return err
		}
		for _, r := range rs {
			if r.Dst == nil || r.Protocol == 2 /* kernel: the interface's own prefixes */ {
				continue
			}
			ones, _ := r.Dst.Mask.Size()
			if a, ok := netip.AddrFromSlice(r.Dst.IP); ok {
				have[netip.PrefixFrom(a.Unmap(), ones)] = r
			}
		}
	}
	var errs []error
	wantSet := map[netip.Prefix]bool{}
	for _, p := range want {
		wantSet[p] = true
		if _, ok := have[p]; ok {
			continue
		}
		r := netlink.Route{LinkIndex: link.Attrs().Index, Dst: prefixIPNet(p)}
		if err := netlink.RouteReplace(&r); err != nil {
			errs = append(errs, fmt.Errorf("route %v: %w", p, err))
		}
	}
	for p, r := range have {
		if !wantSet[p] {
			if err := netlink.RouteDel(&r); err != nil {
				errs = append(errs, fmt.Errorf("remove route %v: %w", p, err))
			}
		}
	}
	return errors.Join(errs...)
}

func prefixIPNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}
