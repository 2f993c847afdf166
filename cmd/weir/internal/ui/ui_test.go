package ui

import (
	"slices"
	"strings"
	"testing"
	"time"

	"weir/cmd/weir/api"
)

func status(at time.Time, gen int64, eff int, e *api.Explanation) api.Status {
	return api.Status{
		Generation: gen, LoadedAt: at, SampledAt: at,
		Services: []api.Service{{Name: "shop", Targets: []api.Target{{Name: "carol", Weight: 4, Effective: eff, Open: 3, Max: 10, Explanation: e}}}},
		Levels:   []api.Level{{Level: "virtual server", Name: "shop", Bandwidth: 1000, MaxBandwidth: 5000, Connections: 3, MaxConnections: 50}},
		Refusals: []api.Refusal{{Level: "virtual server", Limit: "maxConnections", Count: uint64(gen)}},
	}
}

// TestRecorderIsBounded: a series keeps the last n samples, oldest first,
// and its memory is the stated per-sample cost.
func TestRecorderIsBounded(t *testing.T) {
	r := NewRecorder(5)
	t0 := time.Unix(1000, 0)
	for i := range 12 {
		r.Record(status(t0.Add(time.Duration(i)*time.Second), 1, i, nil))
	}
	h := r.History()
	if len(h.Targets) != 1 || len(h.Levels) != 1 || len(h.Refusals) != 1 {
		t.Fatalf("series: %d targets, %d levels, %d refusals", len(h.Targets), len(h.Levels), len(h.Refusals))
	}
	ts := h.Targets[0]
	if len(ts.At) != 5 || ts.Effective[0] != 7 || ts.Effective[4] != 11 || ts.At[4] != t0.Add(11*time.Second).UnixMilli() {
		t.Errorf("kept %v at %v, want effective 7..11", ts.Effective, ts.At)
	}
	if h.Interval != time.Second || h.Capacity != 5 {
		t.Errorf("interval %v capacity %d", h.Interval, h.Capacity)
	}
	if want := 5*8 + 5*TargetSampleBytes + 5*LevelSampleBytes + 5*RefusalSampleBytes; r.Bytes() != want {
		t.Errorf("Bytes() = %d, want %d", r.Bytes(), want)
	}
	// docs/operations.md's Admin API section states these.
	if TargetSampleBytes != 36 || LevelSampleBytes != 32 || RefusalSampleBytes != 16 {
		t.Errorf("a sample costs %d (target), %d (level), %d (refusal) bytes: docs/operations.md says 36, 32, 16",
			TargetSampleBytes, LevelSampleBytes, RefusalSampleBytes)
	}
	if NewRecorder(0).Capacity() != DefaultSamples {
		t.Error("n 0 is not the default")
	}
}

// TestRecorderDropsGoneSeries: a target a reload removed ages out once it
// has no sample left in the window, and the reload is on the time axis.
func TestRecorderDropsGoneSeries(t *testing.T) {
	r := NewRecorder(3)
	t0 := time.Unix(1000, 0)
	r.Record(status(t0, 1, 4, nil))
	st := status(t0.Add(time.Second), 2, 4, nil)
	st.Services[0].Targets[0].Name = "dave"
	st.LoadedAt = t0.Add(500 * time.Millisecond)
	r.Record(st)
	if h := r.History(); len(h.Targets) != 2 || len(h.Reloads) != 1 || h.Reloads[0].Generation != 2 || h.Reloads[0].At != st.LoadedAt.UnixMilli() {
		t.Fatalf("after the reload: %d target series, reloads %+v", len(h.Targets), h.Reloads)
	}
	for i := 2; i < 5; i++ {
		st.SampledAt = t0.Add(time.Duration(i) * time.Second)
		r.Record(st)
	}
	h := r.History()
	if len(h.Targets) != 1 || h.Targets[0].Target != "dave" {
		t.Errorf("carol is still kept: %+v", h.Targets)
	}
	if len(h.Reloads) != 0 {
		t.Errorf("a reload older than the window is kept: %+v", h.Reloads)
	}
	st.ReloadFailures, st.ReloadError = 1, &api.ReloadError{At: st.SampledAt, Err: "bad yaml"}
	st.SampledAt = st.SampledAt.Add(time.Second)
	r.Record(st)
	if h := r.History(); len(h.Reloads) != 1 || h.Reloads[0].Error != "bad yaml" {
		t.Errorf("rejected reload: %+v", h.Reloads)
	}
}

// TestFractionParts: the parts add up to the fraction, each named by the
// rule that set it.
func TestFractionParts(t *testing.T) {
	for _, tc := range []struct {
		name string
		e    api.Explanation
		want targetPoint
	}{
		{"loss and timeout", api.Explanation{LossFraction: 25, TimeoutFraction: 50, DefaultFraction: 75, Fraction: 75}, targetPoint{loss: 25, timeout: 50}},
		{"capped", api.Explanation{LossFraction: 75, TimeoutFraction: 50, DefaultFraction: 100, Fraction: 100}, targetPoint{loss: 75, timeout: 25}},
		{"pressure", api.Explanation{LossFraction: 25, DefaultFraction: 100, Constrained: true, Fraction: 100}, targetPoint{loss: 25, pressure: 75}},
		{"maxconn", api.Explanation{LossFraction: 25, DefaultFraction: 25, ConnFraction: 85, Fraction: 85}, targetPoint{loss: 25, conn: 60}},
		{"minrate", api.Explanation{DefaultFraction: 0, MinRateFraction: 100, Fraction: 100}, targetPoint{rate: 100}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := targetSample(api.Target{Explanation: &tc.e})
			got := [5]int8{p.loss, p.timeout, p.pressure, p.conn, p.rate}
			want := [5]int8{tc.want.loss, tc.want.timeout, tc.want.pressure, tc.want.conn, tc.want.rate}
			if got != want {
				t.Errorf("parts %v, want %v", got, want)
			}
			sum := 0
			for _, v := range got {
				sum += int(v)
			}
			if sum != tc.e.Fraction {
				t.Errorf("parts add up to %d, fraction %d", sum, tc.e.Fraction)
			}
		})
	}
}

// TestRender: every chart is there with one point per sample, stacked parts
// reach the fraction, limits and reloads are drawn.
func TestRender(t *testing.T) {
	r := NewRecorder(10)
	t0 := time.Unix(1000, 0)
	for i := range 4 {
		e := &api.Explanation{LossFraction: 25 * i, DefaultFraction: 25 * i, Fraction: 25 * i, LossRatio: 20 * i}
		r.Record(status(t0.Add(time.Duration(i)*time.Second), int64(1+i/2), 4-i, e))
	}
	var b strings.Builder
	Render(&b, r.History())
	out := b.String()
	for _, want := range []string{
		`id="weight-shop-carol" data-chart="weight" data-points="4"`,
		`data-series="effective" data-n="4" data-last="1" data-max="4"`,
		`data-series="loss_part" data-n="4" data-last="75" data-max="75"`,
		`data-series="loss_from_target" data-n="4" data-last="6" data-max="6"`,
		`data-series="max" data-n="4" data-last="10"`,
		`data-chart="bandwidth"`, `data-series="max_bandwidth"`,
		`data-chart="refusals"`, `data-series="refused" data-n="4" data-last="0" data-max="1"`,
		`<line class="reload"`, `reload: generation 2`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("render lacks %s", want)
		}
	}
	if strings.Contains(out, `data-series="loss_to_target"`) {
		t.Error("a direction the status does not tell apart is drawn")
	}
	var empty strings.Builder
	Render(&empty, NewRecorder(3).History())
	if !strings.Contains(empty.String(), "no samples yet") {
		t.Errorf("empty history: %s", empty.String())
	}
}

func TestNice(t *testing.T) {
	for in, want := range map[float64]float64{0: 1, 0.3: 0.5, 1: 1, 4: 5, 11: 20, 900: 1000, 120000: 200000} {
		if got := nice(in); got != want {
			t.Errorf("nice(%v) = %v, want %v", in, got, want)
		}
	}
}

// TestLossDirections: each direction's loss ratio is its interval's
// retransmitted / data segments; an unmeasured direction is -1.
func TestLossDirections(t *testing.T) {
	r := NewRecorder(4)
	t0 := time.Unix(1000, 0)
	seg := func(fromData, fromRe, toData, toRe uint64, toSource string) *api.Segments {
		return &api.Segments{
			FromTarget: api.DirTotals{DataSegments: fromData, Retransmitted: fromRe, Source: "measured"},
			ToTarget:   api.DirTotals{DataSegments: toData, Retransmitted: toRe, Source: toSource},
		}
	}
	for i, s := range []*api.Segments{seg(100, 0, 50, 0, "measured"), seg(300, 10, 150, 1, "measured"), seg(300, 10, 150, 1, "none")} {
		st := status(t0.Add(time.Duration(i)*time.Second), 1, 4, nil)
		st.Services[0].Targets[0].Segments = s
		r.Record(st)
	}
	ts := r.History().Targets[0]
	if got, want := ts.LossFromTarget, []int{-1, 50, 0}; !slices.Equal(got, want) {
		t.Errorf("from target %v, want %v (tenths of a percent)", got, want)
	}
	if got, want := ts.LossToTarget, []int{-1, 10, -1}; !slices.Equal(got, want) {
		t.Errorf("to target %v, want %v", got, want)
	}
}
