// Package demo is `weir demo`: the whole appliance in a lab, through the
// seeds' scenarios, with what each one showed.
package demo

import (
	"context"
	_ "embed"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"weir/bench"
	"weir/cmd/weir/api"
	"weir/cmd/weir/internal/admin"
	"weir/cmd/weir/internal/appliance"
	"weir/cmd/weir/internal/lab"
	"weir/cmd/weir/internal/metrics"
	"weir/cmd/weir/internal/ui"
	"weir/cmd/weir/internal/view"
	"weir/datapath"
	"weir/datapath/fault"
	"weir/policy"
	"weir/policy/config"
)

// Config is the embedded default configuration `weir demo` runs.
//
//go:embed demo.yaml
var Config []byte

// Options configure Run. The zero value prints plain lines to io.Discard.
type Options struct {
	Out io.Writer
	// Live redraws a status table in place while each scenario runs (for a
	// terminal); otherwise progress is printed as plain lines.
	Live bool
	// Log receives the appliance's own log (STATS lines, limit events);
	// nil discards it.
	Log *zerolog.Logger
	// Loss is the drop rate injected on carol's leg; zero means 5 %.
	Loss float64
	// Front and Dial replace the in-memory clients (see lab.Options):
	// weir demo --tun runs the clients' side through a real TUN.
	Front datapath.Device
	Dial  bench.DialFunc

	// UI, when set, is a loopback host:port (port 0 picks one) where the
	// demo serves weir's admin API with the status page at /ui while it
	// runs, keeping History samples per series (0: ui.DefaultSamples).
	UI      string
	History int
	// Serving is called with the page's URL once it is served.
	Serving func(url string)
	// Keep keeps the appliance and the page running after the scenarios,
	// until ctx ends (weir demo --ui).
	Keep bool
	// AfterScenario is called after each scenario, the appliance still
	// running (a test looks at the page there).
	AfterScenario func(Result)
}

// Result is one scenario's outcome.
type Result struct {
	Scenario string
	OK       bool
	Detail   string
}

// Run runs the whole appliance over in-memory transports with built-in
// backends and load, through the seeds' scenarios, and returns what each
// showed. It needs no root and finishes in well under a minute.
func Run(ctx context.Context, o Options) ([]Result, error) {
	out := o.Out
	if out == nil {
		out = io.Discard
	}
	loss := o.Loss
	if loss == 0 {
		loss = 0.05
	}
	cfg, err := config.ParseYAML("demo.yaml", Config)
	if err != nil {
		return nil, fmt.Errorf("embedded demo config: %w", err)
	}
	ao := appliance.Options{Source: "embedded demo.yaml", Log: o.Log}
	var rec *ui.Recorder
	if o.UI != "" {
		rec = ui.NewRecorder(o.History)
		ao.OnSample = rec.Record
	}
	l, err := lab.New(cfg, lab.Options{
		Front:     o.Front,
		Dial:      o.Dial,
		Appliance: ao,
		Backend: func(k policy.TargetKey, b *bench.Backend) {
			switch k.Service {
			case "cluster":
				b.Delay = 1500 * time.Millisecond // slow members build a backlog
			case "media":
				b.Body = downloadBody
			}
		},
	})
	if err != nil {
		return nil, err
	}
	defer l.Close()
	app := l.App
	app.Start()
	if rec != nil {
		reg := prometheus.NewRegistry()
		reg.MustRegister(metrics.NewCollector(app.Status))
		stop, err := servePage(o, app, rec, reg)
		if err != nil {
			return nil, err
		}
		defer stop()
	}

	d := &demo{lab: l, out: out, live: o.Live}
	var results []Result
	for _, sc := range []struct {
		title string
		run   func(context.Context) Result
	}{
		{"1. weighted distribution (smooth weighted round robin over WLM weights)", d.distribution},
		{"2. MaxConnections: members at 3 and 4, 30 concurrent slow clients", d.maxConnections},
		{fmt.Sprintf("3. %.0f %% loss toward carol, uploads (weir's segments, to_target): loss fraction up, weight down, traffic away and back", loss*100),
			func(ctx context.Context) Result { return d.lossShift(ctx, loss, lossCase{service: "shop"}) }},
		{fmt.Sprintf("4. %.0f %% loss on carol's responses, downloads of %d KiB (her own segments, from_target): the same, measured on her side", loss*100, downloadBody>>10),
			func(ctx context.Context) Result {
				return d.lossShift(ctx, loss, lossCase{service: "media", download: true})
			}},
		{"5. ToS 10100000 on every packet of the Telnet rule, SYN-ACK included", d.tos},
	} {
		if ctx.Err() != nil {
			break
		}
		fmt.Fprintf(out, "\n== %s\n", sc.title)
		r := sc.run(ctx)
		mark := "ok  "
		if !r.OK {
			mark = "FAIL"
		}
		fmt.Fprintf(out, "   %s %s\n", mark, r.Detail)
		results = append(results, r)
		if o.AfterScenario != nil {
			o.AfterScenario(r)
		}
	}

	fmt.Fprintln(out, "\n== summary")
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  SCENARIO\tRESULT\tWHAT IT SHOWED")
	for _, r := range results {
		res := "ok"
		if !r.OK {
			res = "FAIL"
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\n", r.Scenario, res, r.Detail)
	}
	tw.Flush()
	fmt.Fprintln(out)
	view.WriteTable(out, app.Status())
	if o.Keep && rec != nil && ctx.Err() == nil {
		fmt.Fprintln(out, "\nthe appliance keeps running with its status page; Ctrl-C ends it")
		<-ctx.Done()
		return results, nil
	}
	return results, ctx.Err()
}

// servePage serves the admin API with the status page on o.UI (loopback
// only: the demo sets no token) and says where.
func servePage(o Options, app *appliance.Appliance, rec *ui.Recorder, reg *prometheus.Registry) (stop func(), err error) {
	srv, err := admin.Listen(admin.Options{Addr: o.UI, History: rec.History}, app, reg)
	if err != nil {
		return nil, fmt.Errorf("--ui: %w", err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.Serve()
	}()
	url := "http://" + srv.Addr() + "/ui"
	if o.Out != nil {
		fmt.Fprintf(o.Out, "status page: %s (history: %d samples per series)\n", url, rec.Capacity())
	}
	if o.Serving != nil {
		o.Serving(url)
	}
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
		<-done
	}, nil
}

type demo struct {
	lab  *lab.Lab
	out  io.Writer
	live bool
}

// watch runs load in the background and shows the shop and cluster targets
// every 250 ms (live) until it returns.
func (d *demo) watch(ctx context.Context, service string, load bench.Load) bench.Result {
	done := make(chan bench.Result, 1)
	load.Dial = d.lab.Dial
	go func() { done <- load.Run(ctx) }()
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case r := <-done:
			if d.live {
				d.frame(service, true)
			}
			return r
		case <-t.C:
			if d.live {
				d.frame(service, false)
			}
		}
	}
}

// frame redraws the progress line: each target of the service with its
// open connections, picks and effective weight. The final frame ends the line.
func (d *demo) frame(service string, last bool) {
	st := d.lab.App.Status()
	var b strings.Builder
	b.WriteString("\r\033[K   ")
	for _, s := range st.Services {
		if s.Name != service {
			continue
		}
		for i, t := range s.Targets {
			if i > 0 {
				b.WriteString(" | ")
			}
			max := "∞"
			if t.Max > 0 {
				max = fmt.Sprint(t.Max)
			}
			fmt.Fprintf(&b, "%s %d/%s open, %d picked, w %d→%d", t.Name, t.Open, max, t.Picked, t.Weight, t.Effective)
		}
	}
	if last {
		b.WriteString("\n")
	}
	fmt.Fprint(d.out, b.String())
}

func (d *demo) distribution(ctx context.Context) Result {
	r := d.watch(ctx, "shop", bench.Load{Addr: "198.19.0.80:80", Clients: 4, Requests: 300, Duration: 20 * time.Second})
	want := map[string]float64{"alice": 0.4, "bob": 0.2, "carol": 0.4}
	ok := r.OK == 300
	var parts []string
	for _, s := range r.Share() {
		parts = append(parts, fmt.Sprintf("%s %.1f%% (weight %.0f%%)", s.Name, s.Share*100, want[s.Name]*100))
		if d := s.Share - want[s.Name]; d > 0.02 || d < -0.02 {
			ok = false
		}
		fmt.Fprintf(d.out, "   %-6s %4d requests  %5.1f%%  (weight share %.0f%%)\n", s.Name, s.Count, s.Share*100, want[s.Name]*100)
	}
	return Result{Scenario: "weighted distribution", OK: ok,
		Detail: fmt.Sprintf("%d/%d OK over 4:2:4 — %s", r.OK, r.Requests, strings.Join(parts, ", "))}
}

func (d *demo) maxConnections(ctx context.Context) Result {
	r := d.watch(ctx, "cluster", bench.Load{Addr: "198.19.0.81:80", Clients: 30, Requests: 30, Duration: 20 * time.Second})
	b5 := d.lab.Backends[policy.TargetKey{Service: "cluster", Target: "wasmember05"}]
	b6 := d.lab.Backends[policy.TargetKey{Service: "cluster", Target: "wasmember06"}]
	var reason string
	for k := range r.Reasons {
		reason = k
	}
	fmt.Fprintf(d.out, "   served %d, refused with 503: %d; most at once: wasmember05 %d/3, wasmember06 %d/4\n",
		r.OK, r.Refused503, b5.MaxActive(), b6.MaxActive())
	if reason != "" {
		fmt.Fprintf(d.out, "   503 page: %s\n", reason)
	}
	// Once the backlog drains both members serve again.
	after := bench.Load{Dial: d.lab.Dial, Addr: "198.19.0.81:80", Clients: 2, Requests: 4, Duration: 20 * time.Second}.Run(ctx)
	fmt.Fprintf(d.out, "   after the backlog drained: %v\n", after.PerTarget)
	ok := r.OK == 7 && r.Refused503 == 23 && b5.MaxActive() <= 3 && b6.MaxActive() <= 4 &&
		strings.Contains(reason, "at limit") && after.PerTarget["wasmember05"] > 0 && after.PerTarget["wasmember06"] > 0
	return Result{Scenario: "MaxConnections", OK: ok,
		Detail: fmt.Sprintf("%d served at once (3+4), %d got 503 naming the limits; both serve again after", r.OK, r.Refused503)}
}

// downloadBody is the size of media's answers: the download case
// wants responses of at least 100 KiB, so that the target's own data
// segments outnumber everything else on the leg.
const downloadBody = 128 << 10

// lossCase is one side of the loss scenario: uploads to shop with carol's
// inbound packets dropped (weir's segments, to_target), or downloads from
// media with carol's outbound packets dropped (her own, from_target).
type lossCase struct {
	service  string
	download bool
}

func (c lossCase) load(d time.Duration) bench.Load {
	if c.download {
		return bench.Load{Addr: "198.19.0.82:80", Clients: 6, Duration: d}
	}
	return bench.Load{Addr: "198.19.0.80:80", Clients: 6, Upload: 48 << 10, Duration: d}
}

// direction names the leg's direction the case drops packets on.
func (c lossCase) direction() string {
	if c.download {
		return "from_target"
	}
	return "to_target"
}

// dir picks the case's direction from a target's totals.
func (c lossCase) dir(s api.Segments) api.DirTotals {
	if c.download {
		return s.FromTarget
	}
	return s.ToTarget
}

// measuredLoss is the retransmitted share of the case's direction's data
// segments between two totals, in percent.
func (c lossCase) measuredLoss(before, after api.Segments) (pct float64, segs uint64) {
	b, a := c.dir(before), c.dir(after)
	segs = a.DataSegments - b.DataSegments
	return 100 * float64(a.Retransmitted-b.Retransmitted) / float64(max(segs, 1)), segs
}

func (d *demo) lossShift(ctx context.Context, loss float64, c lossCase) Result {
	carol := policy.TargetKey{Service: c.service, Target: "carol"}
	f := d.lab.Faults[carol]
	share := func(r bench.Result) float64 {
		return float64(r.PerTarget["carol"]) / float64(max(r.OK, 1))
	}
	// show prints a phase: the explanation of the last interval under its
	// load, and carol's segments over the phase. The totals grow once per
	// sampling interval, so they are read after the first sample taken
	// once the load is over: between two phases no traffic flows, and each
	// phase's delta holds its own segments only.
	show := func(phase string, r bench.Result, from api.Segments) (policy.Explanation, float64, api.Segments) {
		e, _ := d.lab.App.Explanation(carol)
		to := d.sampled(ctx, carol)
		pct, segs := c.measuredLoss(from, to)
		down := ""
		if n := d.lab.App.TargetFailures(carol); n > 0 {
			down = fmt.Sprintf("; %d connects to carol timed out, each resting her %v", n, d.lab.App.Config().Balancer.RetryInterval)
		}
		fmt.Fprintf(d.out, "   %-12s carol served %4.1f%% of %d requests; %s %.1f%% of %d data segments resent; loss %s → fraction %d%%, weight %d → %d%s\n",
			phase, share(r)*100, r.OK, c.direction(), pct, segs, view.Tenths(e.LossRatio), e.Fraction, e.BaseWeight, e.Weight, down)
		return e, pct, to
	}
	drop := func(rate float64) {
		if c.download {
			// Read: packets read from carol's side, her segments toward weir.
			f.SetRates(fault.Rates{}, fault.Rates{Drop: rate})
		} else {
			f.SetRates(fault.Rates{Drop: rate}, fault.Rates{})
		}
	}
	s0 := d.sampled(ctx, carol)
	before := d.watch(ctx, c.service, c.load(2*time.Second))
	_, _, s1 := show("clean", before, s0)

	drop(loss)
	// The strongest cut while the loss lasts, not only the last interval's:
	// a connect that times out under the loss rests carol for the retry
	// interval, and an interval she sat out reads no loss.
	stop, peaked := make(chan struct{}), make(chan policy.Explanation, 1)
	go func() {
		var best policy.Explanation
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				peaked <- best
				return
			case <-t.C:
				if e, ok := d.lab.App.Explanation(carol); ok && e.LossFraction > best.LossFraction {
					best = e
				}
			}
		}
	}()
	during := d.watch(ctx, c.service, c.load(4*time.Second))
	close(stop)
	eLast, pct, s2 := show("with loss", during, s1)
	eLoss := <-peaked
	if eLoss.LossFraction == 0 {
		eLoss = eLast
	}
	fmt.Fprintf(d.out, "   %-12s loss %s → fraction %d%%, weight %d → %d\n", "strongest", view.Tenths(eLoss.LossRatio), eLoss.LossFraction, eLoss.BaseWeight, eLoss.Weight)
	st := f.Stats()
	dropped := st.Write.Dropped
	if c.download {
		dropped = st.Read.Dropped
	}

	drop(0)
	after := d.watch(ctx, c.service, c.load(6*time.Second))
	eAfter, _, _ := show("loss gone", after, s2)

	ok := eLoss.LossFraction > 0 && eLoss.Weight < eLoss.BaseWeight && share(during) < share(before) &&
		eAfter.Weight == eAfter.BaseWeight
	if c.download {
		// The target's own resends are the measurement: within a factor 2
		// of the injected rate, as the issue asks.
		ok = ok && pct >= loss*100/2 && pct <= loss*100*2
	}
	return Result{Scenario: c.name(), OK: ok, Detail: fmt.Sprintf(
		"%d packets dropped; carol's %s loss read %.1f%%, loss fraction reached %d%%, weight %d→%d, share %.0f%%→%.0f%%→%.0f%%",
		dropped, c.direction(), pct, eLoss.LossFraction, eLoss.BaseWeight, eLoss.Weight,
		share(before)*100, share(during)*100, share(after)*100)}
}

// sampled returns k's segment totals from the first sampling interval that
// ends from now on (bounded by three intervals, or ctx).
func (d *demo) sampled(ctx context.Context, k policy.TargetKey) api.Segments {
	start := time.Now()
	bound := start.Add(3 * d.lab.App.Config().Monitor.SamplingInterval)
	for time.Now().Before(bound) && ctx.Err() == nil && !d.lab.App.Status().SampledAt.After(start) {
		time.Sleep(20 * time.Millisecond)
	}
	s, _ := d.lab.App.SegmentsOf(k)
	return s
}

// name is the summary's scenario name.
func (c lossCase) name() string {
	if c.download {
		return "download loss moves weight"
	}
	return "loss moves weight"
}

func (d *demo) tos(ctx context.Context) Result {
	before := d.lab.App.DatapathStats().Marked
	r := bench.Load{Dial: d.lab.Dial, Addr: "198.19.0.23:23", Clients: 2, Requests: 20, Duration: 10 * time.Second}.Run(ctx)
	marked := d.lab.App.DatapathStats().Marked - before
	fmt.Fprintf(d.out, "   %d Telnet connections, %d packets toward clients marked ToS 0xA0\n", r.OK, marked)
	return Result{Scenario: "ToS marking", OK: r.OK == 20 && marked >= uint64(3*r.OK),
		Detail: fmt.Sprintf("%d packets marked over %d connections (≥ 3 each: SYN-ACK, data, FIN)", marked, r.OK)}
}
