package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/vishvananda/netlink"

	"weir/internal/netns"
)

// options are the harness's flags.
type options struct {
	Weir      string        // the weir binary
	OutDir    string        // where bench-e2e.md, .json and the logs go
	Reps      int           // repetitions of every (test, path)
	IperfTime time.Duration // per iperf3 run (whole seconds)
	ConnTime  time.Duration // per connection-rate run
	Pause     time.Duration // between runs, for TIME_WAIT and queues to settle
	PeerCmd   string        // the peer appliance's command ("" means none)
	KProxy    bool          // also measure the kernel-socket proxy (kproxy.go)
	HAProxy   bool          // measure HAProxy, the yardstick (haproxy.go)
	PeerName  string        // its column's name
	PeerWeir  string        // a weir variant as the peer ("" means none): see peerWeirVariants
	PeerWArgs string        // extra arguments for the peer weir's run
	PeerWBin  string        // the peer weir's binary ("" means Weir)
	Note      string        // a line for the report's header (the machine's state)
	Tests     string        // comma-separated test IDs to run ("" means all)
	WeirArgs  string        // extra arguments for weir run, split on spaces
	WeirEnv   string        // extra NAME=VALUE environment for weir run, split on spaces
	Profile   string        // a test ID whose weir runs are CPU-profiled ("" means none)
	Idle      int           // idle spliced connections to hold and measure (0: none)
	UDPRate   string        // iperf3 -u's target bitrate (-b)
}

// testKind is what a test drives.
type testKind string

const (
	iperfTest testKind = "iperf3"
	udpTest   testKind = "iperf3-udp" // iperf3 -u: datagrams, a udp service through weir
	connTest  testKind = "connrate"
)

// udpLen is iperf3 -u's datagram payload (-l): the bytes a TCP segment
// carries on the 1500-byte veths, so that no path fragments (iperf3 would
// take its own length from the control connection's MSS, which differs
// through weir's TUN).
const udpLen = 1448

// testDef is one measurement of the matrix.
type testDef struct {
	ID          string   `json:"id"`
	Name        string   `json:"name"`
	Kind        testKind `json:"kind"`
	Streams     int      `json:"streams,omitempty"`      // iperf3 -P
	Reverse     bool     `json:"reverse,omitempty"`      // iperf3 -R
	Clients     int      `json:"clients,omitempty"`      // connection-rate concurrency
	ServerClose bool     `json:"server_close,omitempty"` // the server closes first
}

// unit is what the test's primary figure counts.
func (t testDef) unit() string {
	if t.Kind == iperfTest || t.Kind == udpTest {
		return "Gbit/s"
	}
	return "conn/s"
}

var tests = []testDef{
	{ID: "stream1", Name: "1 stream", Kind: iperfTest, Streams: 1},
	{ID: "stream4", Name: "4 streams", Kind: iperfTest, Streams: 4},
	{ID: "reverse", Name: "reverse (server → client)", Kind: iperfTest, Streams: 1, Reverse: true},
	{ID: "udp1", Name: "UDP, 1 stream (iperf3 -u)", Kind: udpTest, Streams: 1},
	{ID: "conn1", Name: "new conns, c1", Kind: connTest, Clients: 1},
	{ID: "conn16", Name: "new conns, c16", Kind: connTest, Clients: 16},
	{ID: "conn1-sc", Name: "new conns, c1, server closes first", Kind: connTest, Clients: 1, ServerClose: true},
	{ID: "conn16-sc", Name: "new conns, c16, server closes first", Kind: connTest, Clients: 16, ServerClose: true},
}

// path is one way from the client to the server.
type path struct {
	Name  string `json:"name"`
	Addr  string `json:"addr"` // what the client connects to
	app   *daemon
	admin *admin // weir's admin API; nil for the others
	// noUDP says why the path carries no UDP ("": it does); its udp
	// tests are recorded as not applicable, never as a figure.
	noUDP string
}

// sample is one run of one test on one path.
type sample struct {
	Test string `json:"test"`
	Path string `json:"path"`
	Rep  int    `json:"rep"`
	// Value is the primary figure: Gbit/s or connections per second.
	Value float64 `json:"value"`
	// Bytes is what iperf3's receiver got.
	Bytes int64           `json:"bytes,omitempty"`
	Conn  *connRateResult `json:"conn,omitempty"`
	UDP   *udpResult      `json:"udp,omitempty"`
	// NA says why the path cannot run the test (HAProxy has no UDP): no
	// figure, no error.
	NA string `json:"not_applicable,omitempty"`
	// CPUSec and PeakRSS are the appliance's during the run (none for the
	// kernel).
	CPUSec  float64 `json:"cpu_sec,omitempty"`
	PeakRSS int64   `json:"peak_rss_bytes,omitempty"`
	Err     string  `json:"error,omitempty"`
	// Profile is the CPU profile taken during the run (-profile).
	Profile *profileResult `json:"-"`
}

// preflightBench says why the harness cannot run here, if it cannot.
func preflightBench(o options) error {
	if os.Geteuid() != 0 {
		return &skipError{"needs root: it builds network namespaces and runs weir on a TUN (run sudo make bench-e2e)"}
	}
	if _, err := exec.LookPath("iperf3"); err != nil {
		return &skipError{"needs iperf3 (bash scripts/bench-deps.sh installs it)"}
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		return &skipError{fmt.Sprintf("needs /dev/net/tun: %v", err)}
	}
	if _, err := os.Stat(o.Weir); err != nil {
		return fmt.Errorf("weir binary: %w (make build)", err)
	}
	if o.HAProxy {
		if _, err := haproxyBin(); err != nil {
			return err
		}
	}
	return nil
}

func benchMain(args []string) error {
	fs := newFlagSet("")
	var o options
	fs.StringVar(&o.Weir, "weir", "bin/weir", "the weir `binary`")
	fs.StringVar(&o.OutDir, "out", "bench/out", "output `dir`")
	fs.IntVar(&o.Reps, "reps", 3, "repetitions, interleaved")
	fs.DurationVar(&o.IperfTime, "iperf-time", 10*time.Second, "per iperf3 run (whole seconds)")
	fs.DurationVar(&o.ConnTime, "conn-time", 10*time.Second, "per connection-rate run")
	fs.DurationVar(&o.Pause, "pause", time.Second, "pause between runs")
	fs.StringVar(&o.PeerCmd, "peer-cmd", os.Getenv("PEER_CMD"), "another TUN appliance's `command` (default $PEER_CMD)")
	fs.BoolVar(&o.KProxy, "kproxy", false, "also measure a kernel-socket TCP proxy in the router (a yardstick: what terminating each connection costs without a TUN or a userspace stack)")
	fs.BoolVar(&o.HAProxy, "haproxy", true, "measure HAProxy (mode tcp, its defaults) in the router as the yardstick column; every figure is also a ratio to its")
	fs.StringVar(&o.PeerName, "peer-name", envOr("PEER_NAME", "peer"), "the peer's column `name` (default $PEER_NAME or peer)")
	fs.StringVar(&o.PeerWeir, "peer-weir", "", "run the same weir binary as the peer, with the config `variant` "+peerWeirVariantNames()+" (instead of -peer-cmd): the measured paths beside weir's default")
	fs.StringVar(&o.PeerWArgs, "peer-weir-args", "", "extra `args` for the -peer-weir weir (split on spaces), e.g. '--procs 2'")
	fs.StringVar(&o.PeerWBin, "peer-weir-bin", "", "the -peer-weir weir's `binary` (default -weir's): another build beside this one")
	fs.StringVar(&o.Note, "note", "machine not quiet: shared with other developers; the figures are orientation", "a `line` for the report's header")
	fs.StringVar(&o.Tests, "tests", "", "comma-separated test `ids` to run (default all: "+testIDs()+")")
	fs.StringVar(&o.WeirArgs, "weir-args", "", "extra `args` for weir run (split on spaces), e.g. '--queues 2'")
	fs.StringVar(&o.WeirEnv, "weir-env", "", "extra `NAME=VALUE` environment for weir run (split on spaces), e.g. 'GOGC=50 GOMEMLIMIT=64MiB'")
	fs.StringVar(&o.Profile, "profile", "", "CPU-profile weir during each run of test `id` (pprof files in the log dir, top in the report)")
	fs.IntVar(&o.Idle, "idle", 10000, "idle spliced connections to hold through weir and measure per connection (0: skip)")
	fs.StringVar(&o.UDPRate, "udp-rate", "2G", "iperf3 -u's target `bitrate` (-b, e.g. 800M, 2G; 0: as fast as it can) for the udp1 test: near the iperf3 client's own ceiling (2.0-2.3 Gbit/s with -b 0 on 2 cores, which the kernel path carried whole); a path slower than the offered rate shows loss")
	if err := fs.Parse(args); err != nil {
		return err
	}
	sel, err := selectTests(o.Tests)
	if err != nil {
		return err
	}
	if o.Profile != "" && !slices.ContainsFunc(sel, func(t testDef) bool { return t.ID == o.Profile }) {
		return fmt.Errorf("-profile %q: not among the tests run", o.Profile)
	}
	if o.PeerWeir != "" {
		if o.PeerCmd != "" {
			return errors.New("-peer-weir and -peer-cmd (or $PEER_CMD) name one peer each: choose one")
		}
		if _, ok := peerWeirVariants[o.PeerWeir]; !ok {
			return fmt.Errorf("-peer-weir %q: want one of %s", o.PeerWeir, peerWeirVariantNames())
		}
		if o.PeerName == "peer" {
			o.PeerName = "weir " + o.PeerWeir
		}
	} else if o.PeerWArgs != "" || o.PeerWBin != "" {
		return errors.New("-peer-weir-args and -peer-weir-bin need -peer-weir")
	}
	if o.PeerWBin == "" {
		o.PeerWBin = o.Weir
	}
	if o.Idle < 0 || o.Idle > 15000 {
		return errors.New("need 0 <= -idle <= 15000 (each end holds one descriptor per connection)")
	}
	if o.Reps < 1 || o.Reps > 20 || o.IperfTime < time.Second || o.IperfTime > 5*time.Minute ||
		o.ConnTime <= 0 || o.ConnTime > 5*time.Minute {
		return errors.New("need 1 <= -reps <= 20, 1s <= -iperf-time <= 5m, 0 < -conn-time <= 5m")
	}
	for _, kv := range strings.Fields(o.WeirEnv) {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			return fmt.Errorf("-weir-env %q: want NAME=VALUE", kv)
		}
	}
	if err := preflightBench(o); err != nil {
		return err
	}
	ctx, stop := signalContext()
	defer stop()
	rep, err := runBench(ctx, o, sel)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(o.OutDir, 0o755); err != nil {
		return err
	}
	md := rep.markdown()
	js, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(o.OutDir, "bench-e2e.md"), []byte(md), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(o.OutDir, "bench-e2e.json"), append(js, '\n'), 0o644); err != nil {
		return err
	}
	fmt.Print(md)
	fmt.Printf("\nwritten: %s, %s\n", filepath.Join(o.OutDir, "bench-e2e.md"), filepath.Join(o.OutDir, "bench-e2e.json"))
	return nil
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// runBench builds the topology, starts the servers and appliances, runs the
// matrix and takes everything down again, also on error or ctx's end.
func runBench(ctx context.Context, o options, tests []testDef) (*report, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	logDir := filepath.Join(o.OutDir, "bench-e2e-logs")
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		return nil, err
	}
	topo, err := buildTopology()
	if err != nil {
		return nil, fmt.Errorf("topology: %w", err)
	}
	defer topo.close()
	var daemons []*daemon
	defer func() {
		for i := len(daemons) - 1; i >= 0; i-- {
			daemons[i].stop(3 * time.Second)
		}
	}()
	start := func(ns *netns.NS, name string, env []string, argv ...string) (*daemon, error) {
		d, err := startDaemon(ns, logDir, name, env, argv...)
		if err == nil {
			daemons = append(daemons, d)
		}
		return d, err
	}

	if _, err := start(topo.server, "iperf3-server", nil, "iperf3", "-s", "-p", strconv.Itoa(iperfPort)); err != nil {
		return nil, err
	}
	if _, err := start(topo.server, "rrserver", nil, self, "rrserver", "-listen", ":"+strconv.Itoa(rrPort)); err != nil {
		return nil, err
	}

	cfgPath := filepath.Join(logDir, "weir.yaml")
	if err := os.WriteFile(cfgPath, []byte(weirConfig()), 0o644); err != nil {
		return nil, err
	}
	// --pprof: the harness reads weir's goroutines and heap (the idle
	// measurement) and its CPU profile (-profile) there.
	startWeir := func(name string) (*daemon, *admin, error) {
		ready := filepath.Join(logDir, name+".ready")
		os.Remove(ready)
		wargs := []string{o.Weir, "run", "-c", cfgPath, "--tun", weirTUN,
			"--tun-addr", weirTUNAddr, "--admin", "127.0.0.1:0", "--ready-file", ready,
			"--log-format", "json", "--log-level", "warn", "--grace", "1s", "--pprof"}
		wargs = append(wargs, strings.Fields(o.WeirArgs)...)
		weir, err := start(topo.router, name, strings.Fields(o.WeirEnv), wargs...)
		if err != nil {
			return nil, nil, err
		}
		if err := waitFor(ctx, 30*time.Second, weir, func() bool {
			b, err := os.ReadFile(ready)
			return err == nil && bytes.HasSuffix(b, []byte("\n"))
		}); err != nil {
			return nil, nil, fmt.Errorf("weir not ready: %w\n%s", err, weir.tail(4000))
		}
		b, _ := os.ReadFile(ready)
		return weir, &admin{ns: topo.router, addr: strings.TrimSpace(string(b))}, nil
	}
	weir, weirAdmin, err := startWeir("weir")
	if err != nil {
		return nil, err
	}
	paths := []*path{
		{Name: "kernel", Addr: serverAddr},
		{Name: "weir", Addr: weirVIP, app: weir, admin: weirAdmin},
	}

	if o.PeerWeir != "" {
		peerCfg := filepath.Join(logDir, "peer-weir.yaml")
		if err := os.WriteFile(peerCfg, []byte(peerWeirConfig(o.PeerWeir)), 0o644); err != nil {
			return nil, err
		}
		o.PeerCmd = fmt.Sprintf(`%s run -c %s --tun "$BENCH_TUN" --admin 127.0.0.1:0 --log-format json --log-level warn --grace 1s %s`,
			o.PeerWBin, peerCfg, o.PeerWArgs)
	}
	if o.PeerCmd != "" {
		peer, err := start(topo.router, "peer", []string{"BENCH_TUN=" + peerTUN}, "/bin/sh", "-c", o.PeerCmd)
		if err != nil {
			return nil, err
		}
		if err := waitFor(ctx, 20*time.Second, peer, func() bool {
			return topo.router.Do(func() error { _, err := netlink.LinkByName(peerTUN); return err }) == nil
		}); err != nil {
			return nil, fmt.Errorf("PEER_CMD made no TUN %s (it gets its name in $BENCH_TUN): %w\n%s", peerTUN, err, peer.tail(4000))
		}
		if err := topo.router.Do(routePeer); err != nil {
			return nil, err
		}
		paths = append(paths, &path{Name: o.PeerName, Addr: serverPeerIP, app: peer})
	}

	var haVersion string
	if o.HAProxy {
		bin, _ := haproxyBin()
		haVersion = haproxyVersion(bin)
		hcfg := filepath.Join(logDir, "haproxy.cfg")
		if err := os.WriteFile(hcfg, []byte(haproxyConfig(routerHAddr, serverProxyAddr, []int{iperfPort, rrPort})), 0o644); err != nil {
			return nil, err
		}
		// -db: in the foreground, no daemon; the process group is HAProxy.
		ha, err := start(topo.router, "haproxy", nil, bin, "-db", "-f", hcfg)
		if err != nil {
			return nil, err
		}
		if err := waitFor(ctx, 10*time.Second, ha, func() bool {
			return topo.router.Do(func() error {
				c, err := net.DialTimeout("tcp", net.JoinHostPort(routerHAddr, strconv.Itoa(rrPort)), time.Second)
				if err == nil {
					c.Close()
				}
				return err
			}) == nil
		}); err != nil {
			return nil, fmt.Errorf("haproxy not listening: %w\n%s", err, ha.tail(4000))
		}
		// The yardstick's column right after the kernel's.
		paths = slices.Insert(paths, 1, &path{Name: haproxyPath, Addr: routerHAddr, app: ha, noUDP: "no UDP: HAProxy balances TCP only"})
	}

	if o.KProxy {
		kp, err := start(topo.router, "kproxy", nil, self, "kproxy", "-listen", routerCAddr, "-to", serverProxyAddr,
			"-ports", strconv.Itoa(iperfPort)+","+strconv.Itoa(rrPort))
		if err != nil {
			return nil, err
		}
		paths = append(paths, &path{Name: "kproxy", Addr: routerCAddr, app: kp, noUDP: "no UDP: kproxy is a TCP proxy"})
	}

	// Every path must carry a connection before anything is measured: a
	// broken path is an error here, not a column of zeros.
	for _, p := range paths {
		if err := probe(ctx, topo, self, p); err != nil {
			return nil, err
		}
	}

	rep := &report{
		Date: time.Now().UTC().Format(time.RFC3339), Machine: machine(), Note: o.Note,
		Reps: o.Reps, IperfSec: int(o.IperfTime / time.Second), ConnSec: o.ConnTime.Seconds(),
		Tests: tests, WeirArgs: o.WeirArgs, WeirEnv: o.WeirEnv, HAProxyVersion: haVersion,
		StartRSS: map[string]int64{},
	}
	if slices.ContainsFunc(tests, func(t testDef) bool { return t.Kind == udpTest }) {
		rep.UDPRate, rep.UDPLen = o.UDPRate, udpLen
	}
	for _, p := range paths {
		rep.Paths = append(rep.Paths, p.Name)
		// What each appliance holds before the matrix (it has carried the
		// probe only).
		if p.app != nil {
			if u, err := groupUsage(p.app.pid()); err == nil {
				rep.StartRSS[p.Name] = u.RSS
			}
		}
	}
	started := time.Now()
	total := o.Reps * len(tests) * len(paths)
	n := 0
	// Interleaved: every rep runs every test on every path, the paths'
	// order rotating from rep to rep, so that a slow minute of the machine
	// is spread over all of them.
	for r := range o.Reps {
		for _, t := range tests {
			for i := range paths {
				p := paths[(i+r)%len(paths)]
				if err := ctx.Err(); err != nil {
					return nil, fmt.Errorf("interrupted: %w", err)
				}
				n++
				fmt.Fprintf(os.Stderr, "[%d/%d %s] rep %d  %-36s %-8s ", n, total, time.Since(started).Round(time.Second), r+1, t.Name, p.Name)
				s := runOne(ctx, topo, self, o, t, p, r+1, logDir)
				if s.Profile != nil {
					rep.Profiles = append(rep.Profiles, *s.Profile)
				}
				rep.Samples = append(rep.Samples, s)
				switch {
				case s.NA != "":
					fmt.Fprintf(os.Stderr, "— (%s)\n", s.NA)
				case s.Err != "":
					fmt.Fprintf(os.Stderr, "error: %s\n", s.Err)
				case s.UDP != nil:
					fmt.Fprintf(os.Stderr, "%.4g %s, %.2f %% lost\n", s.Value, t.unit(), s.UDP.LostPercent)
				default:
					fmt.Fprintf(os.Stderr, "%.4g %s\n", s.Value, t.unit())
				}
				for _, q := range paths {
					if q.app != nil && q.app.exited() {
						return nil, fmt.Errorf("%s exited during the run: %v\n%s", q.Name, q.app.waitErr, q.app.tail(4000))
					}
				}
				select {
				case <-ctx.Done():
				case <-time.After(o.Pause):
				}
			}
		}
	}
	// The idle measurement runs last, on a weir of its own that has carried
	// nothing but the probe: what N idle connections add to a fresh weir
	// (memory the matrix left resident would hide some of it), and none of
	// it in the matrix's peak RSS.
	if o.Idle > 0 {
		weir.stop(3 * time.Second)
		iw, iadm, err := startWeir("weir-idle")
		if err != nil {
			return nil, err
		}
		if err := probe(ctx, topo, self, &path{Name: "weir", Addr: weirVIP}); err != nil {
			return nil, err
		}
		fmt.Fprintf(os.Stderr, "idle: holding %d spliced connections through a fresh weir\n", o.Idle)
		im, err := measureIdle(ctx, topo, self, logDir, iw, iadm, o.Idle)
		if err != nil {
			return nil, fmt.Errorf("idle measurement: %w", err)
		}
		fmt.Fprintf(os.Stderr, "idle: %.1f KiB RSS, %.1f KiB heap+stacks, %.2f goroutines per connection\n", im.RSSKiBPerConn, im.GoKiBPerConn, im.GoroutinesPerConn)
		rep.Idle = im
	}
	rep.summarize()
	return rep, nil
}

// weirConfig is weir's config for the harness: one TCP service per load,
// both on the VIP, each with the server as its only target, and a udp
// service beside the iperf3 one on its port (iperf3 -u: the control
// connection over TCP, the datagrams over UDP), its defaults otherwise
// (idle timeout 30 s: one session per iperf3 client). The balancer's
// retryInterval is short: at the end of each iperf3 -u test the server
// closes its UDP socket, the datagrams weir still relays then meet ICMP
// port unreachable, and that marks the target down (passive health, as a
// failed dial) for retryInterval: with the default 60 s the next UDP run
// through weir would find its only target down and its datagrams refused.
func weirConfig() string {
	return fmt.Sprintf(`# weirbench: the VIP %[1]s spliced to the server.
balancer:
  retryInterval: 200ms
services:
  - name: iperf
    vips: [%[1]s]
    port: %[2]d
    protocol: tcp
    targets:
      - name: server
        address: %[6]s:%[2]d
  - name: %[5]s
    vips: [%[1]s]
    port: %[2]d
    protocol: udp
    targets:
      - name: server
        address: %[3]s:%[2]d
  - name: rr
    vips: [%[1]s]
    port: %[4]d
    protocol: tcp
    targets:
      - name: server
        address: %[6]s:%[4]d
`, weirVIP, iperfPort, serverAddr, rrPort, udpService, serverWeirAddr)
}

// peerWeirVariants are the configurations -peer-weir runs the weir binary
// with as the peer, each weirConfig serving the peer's address with one
// change: the measured paths of issue 25's Deliver 6 beside weir's default.
var peerWeirVariants = map[string]string{
	// The same configuration: another build's or other flags' weir
	// (-peer-weir-args) against the default one.
	"same": "",
	// via: host legs measured by TCP_INFO alone, without the passive
	// capture of their segments.
	"capture-off": "monitor:\n  hostCapture: off\n",
	// Every tcp target dialed through weir's back arm (its own gVisor stack,
	// out through its TUN), every segment of the target leg measured.
	"netstack": "",
}

func peerWeirVariantNames() string {
	names := slices.Sorted(maps.Keys(peerWeirVariants))
	return strings.Join(names, ", ")
}

// peerWeirConfig is weirConfig for the peer's address with variant's change.
// Its tcp targets are the server's other address (serverAltAddr, weir's
// serverWeirAddr), so that each weir's host-leg capture follows its own
// legs only.
func peerWeirConfig(variant string) string {
	cfg := strings.NewReplacer(weirVIP, serverPeerIP, "# weirbench:", "# weirbench peer ("+variant+"):").Replace(weirConfig())
	var b strings.Builder
	proto := ""
	for line := range strings.Lines(cfg) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "protocol: "); ok {
			proto = v
		}
		if !strings.HasPrefix(strings.TrimSpace(line), "address: ") || proto != "tcp" {
			b.WriteString(line)
			continue
		}
		// The UDP target stays the server's first address: iperf3's UDP
		// server answers from the address its route chooses (that one),
		// which a relay connected to the second would not take; the
		// host-leg capture follows TCP legs only.
		b.WriteString(strings.Replace(line, serverWeirAddr+":", serverAltAddr+":", 1))
		if variant == "netstack" {
			b.WriteString("        via: netstack\n")
		}
	}
	return b.String() + peerWeirVariants[variant]
}

// waitFor polls ok every 50 ms for up to d; it fails early if d's process
// exits or ctx ends.
func waitFor(ctx context.Context, d time.Duration, p *daemon, ok func() bool) error {
	deadline := time.Now().Add(d)
	for !ok() {
		if p.exited() {
			return fmt.Errorf("%s exited: %v", p.name, p.waitErr)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not after %v", d)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil
}

// probe checks that p carries connections: a short connection-rate run
// with no error, and an iperf3 connection.
func probe(ctx context.Context, topo *topology, self string, p *path) error {
	var r connRateResult
	var err error
	for range 3 { // a peer may need a moment after its TUN appears
		r, err = connRate(ctx, topo, self, p.Addr, 1, 300*time.Millisecond, false)
		if err == nil && r.Conns > 0 && r.Errors == 0 {
			return nil
		}
		time.Sleep(300 * time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("path %s (%s) carries no connection: %w", p.Name, p.Addr, err)
	}
	return fmt.Errorf("path %s (%s) carries no connection: %d ok, %d errors %v", p.Name, p.Addr, r.Conns, r.Errors, r.ErrorTexts)
}

// runOne runs test t on path p once, measuring p's appliance around it.
func runOne(ctx context.Context, topo *topology, self string, o options, t testDef, p *path, rep int, logDir string) (s sample) {
	s = sample{Test: t.ID, Path: p.Name, Rep: rep}
	if t.Kind == udpTest && p.noUDP != "" {
		s.NA = p.noUDP
		return s
	}
	if p.admin != nil && t.ID == o.Profile {
		// The profile covers the run but its first and last half second
		// (ramp-up and the connections in flight at the end).
		secs := max(int(runLength(o, t).Seconds())-1, 1)
		ch := p.admin.cpuProfile(ctx, secs, filepath.Join(logDir, fmt.Sprintf("cpu-%s-%s-%d.pprof", t.ID, p.Name, rep)))
		defer func() {
			pr := <-ch
			pr.Test, pr.Rep = t.ID, rep
			s.Profile = &pr
		}()
	}
	var before usage
	if p.app != nil {
		resetPeak(p.app.pid())
		var err error
		if before, err = groupUsage(p.app.pid()); err != nil {
			s.Err = err.Error()
			return s
		}
	}
	switch t.Kind {
	case iperfTest:
		gbps, bytes, err := iperf(ctx, topo, p.Addr, o.IperfTime, t.Streams, t.Reverse)
		if err != nil {
			s.Err = err.Error()
		}
		s.Value, s.Bytes = gbps, bytes
	case udpTest:
		u, err := runUDP(ctx, topo, o, p)
		if err != nil {
			s.Err = err.Error()
		}
		s.Value, s.Bytes, s.UDP = u.Gbps, u.Bytes, &u
	case connTest:
		r, err := connRate(ctx, topo, self, p.Addr, t.Clients, o.ConnTime, t.ServerClose)
		if err != nil {
			s.Err = err.Error()
		}
		s.Value, s.Conn = r.PerSec, &r
	}
	if p.app != nil {
		after, err := groupUsage(p.app.pid())
		if err != nil && s.Err == "" {
			s.Err = err.Error()
		}
		s.CPUSec, s.PeakRSS = after.CPUSec-before.CPUSec, after.PeakRSS
	}
	return s
}

// runLength is how long one run of t takes (the load's own time).
func runLength(o options, t testDef) time.Duration {
	if t.Kind == iperfTest || t.Kind == udpTest {
		return o.IperfTime
	}
	return o.ConnTime
}

// testIDs lists the tests' IDs for the -tests flag's help.
func testIDs() string {
	var ids []string
	for _, t := range tests {
		ids = append(ids, t.ID)
	}
	return strings.Join(ids, ",")
}

// selectTests is the -tests flag's selection, in the matrix's order.
func selectTests(list string) ([]testDef, error) {
	if list == "" {
		return tests, nil
	}
	want := strings.Split(list, ",")
	var out []testDef
	for _, t := range tests {
		if slices.Contains(want, t.ID) {
			out = append(out, t)
		}
	}
	for _, w := range want {
		if !slices.ContainsFunc(tests, func(t testDef) bool { return t.ID == w }) {
			return nil, fmt.Errorf("-tests: no test %q (have %s)", w, testIDs())
		}
	}
	return out, nil
}

// iperf runs iperf3's client in the client namespace against addr.
func iperf(ctx context.Context, topo *topology, addr string, d time.Duration, streams int, reverse bool) (gbps float64, bytes int64, err error) {
	secs := max(int(d/time.Second), 1)
	argv := []string{"iperf3", "-c", addr, "-p", strconv.Itoa(iperfPort), "-t", strconv.Itoa(secs), "-J",
		"-P", strconv.Itoa(max(streams, 1)), "--connect-timeout", "3000"}
	if reverse {
		argv = append(argv, "-R")
	}
	for attempt := 0; ; attempt++ {
		rctx, cancel := context.WithTimeout(ctx, time.Duration(secs)*time.Second+30*time.Second)
		out, err := runIn(rctx, topo.client, argv...)
		cancel()
		gbps, bytes, perr := parseIperf(out)
		// The server answers "busy" while it still winds the last test down.
		if perr != nil && strings.Contains(perr.Error(), "busy") && attempt < 3 {
			time.Sleep(time.Second)
			continue
		}
		if perr != nil {
			return 0, 0, errors.Join(perr, err)
		}
		return gbps, bytes, nil
	}
}

// parseIperf reads iperf3's -J output: the receiver's total.
func parseIperf(out []byte) (gbps float64, bytes int64, err error) {
	var r struct {
		Error string `json:"error"`
		End   struct {
			SumReceived struct {
				Bytes         float64 `json:"bytes"`
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum_received"`
		} `json:"end"`
	}
	if err := json.Unmarshal(out, &r); err != nil {
		return 0, 0, fmt.Errorf("iperf3 output: %w", err)
	}
	if r.Error != "" {
		return 0, 0, fmt.Errorf("iperf3: %s", r.Error)
	}
	if r.End.SumReceived.Bytes <= 0 {
		return 0, 0, errors.New("iperf3: nothing received")
	}
	return r.End.SumReceived.BitsPerSecond / 1e9, int64(r.End.SumReceived.Bytes), nil
}

// connRate runs `weirbench connrate` in the client namespace.
func connRate(ctx context.Context, topo *topology, self, addr string, clients int, d time.Duration, serverClose bool) (connRateResult, error) {
	argv := []string{self, "connrate", "-addr", net.JoinHostPort(addr, strconv.Itoa(rrPort)),
		"-c", strconv.Itoa(clients), "-d", d.String()}
	if serverClose {
		argv = append(argv, "-server-close")
	}
	rctx, cancel := context.WithTimeout(ctx, d+30*time.Second)
	defer cancel()
	out, err := runIn(rctx, topo.client, argv...)
	var r connRateResult
	if err != nil {
		return r, err
	}
	if err := json.Unmarshal(out, &r); err != nil {
		return r, fmt.Errorf("connrate output: %w: %q", err, out)
	}
	return r, nil
}

// machine describes this machine for the report.
func machine() string {
	model := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				model = strings.TrimSpace(v)
				break
			}
		}
	}
	kernel := "unknown kernel"
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		kernel = "Linux " + strings.TrimSpace(string(b))
	}
	return fmt.Sprintf("%d cores (%s), %s, %s, MTU 1500 veths", runtime.NumCPU(), model, kernel, runtime.Version())
}
