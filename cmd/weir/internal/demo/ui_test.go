package demo

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"weir/cmd/weir/api"
	"weir/cmd/weir/internal/ui"
	"weir/internal/testutil"
)

// recordHistory makes TestStatusPageInChromium run the demo once and
// record the status page's history at its two moments into testdata
// (go test -run StatusPageInChromium -record-history ./cmd/weir/internal/demo).
var recordHistory = flag.Bool("record-history", false, "run the demo and record testdata/history-*.json for TestStatusPageInChromium")

// The demo's history at the test's two moments: after the weighted
// distribution scenario (two samples or more, no loss yet) and after the
// loss scenario (carol's weight cut by her loss).
var historyFiles = map[string]string{
	"before": filepath.Join("testdata", "history-before.json"),
	"after":  filepath.Join("testdata", "history-after.json"),
}

// TestStatusPageInChromium looks at the status page as a person does: the
// page (package ui's handler) serves a history the demo's appliance
// recorded (testdata/history-*.json, made by a real demo run with
// -record-history), headless Chromium loads it (running its script, which
// swaps in fresh charts), and the DOM it built must hold the plots with
// data points, carol's loss part rising once the demo's loss scenario ran.
// A screenshot goes to the test's artifact directory (go test -artifacts
// keeps it) and, with WEIR_UI_PNG=path, there too (docs/ui.png in the
// README was made so).
func TestStatusPageInChromium(t *testing.T) {
	if *recordHistory {
		recordDemoHistory(t)
	}
	browser := ""
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			browser = p
			break
		}
	}
	if browser == "" {
		t.Skip("no Chromium: install Debian's chromium (scripts/deps.sh does as root) to test the status page in a browser")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var cur atomic.Pointer[api.History]
	srv := httptest.NewServer(ui.Handler(func() api.History { return *cur.Load() }))
	defer srv.Close()
	url := srv.URL + "/ui"
	doms := map[string]string{}
	for _, moment := range []string{"before", "after"} {
		h := readHistory(t, historyFiles[moment])
		cur.Store(&h)
		doms[moment] = dumpDOM(t, ctx, browser, url)
		if moment == "after" {
			shot := filepath.Join(t.ArtifactDir(), "ui.png")
			screenshot(t, ctx, browser, url, shot)
			if p := os.Getenv("WEIR_UI_PNG"); p != "" {
				screenshot(t, ctx, browser, url, p)
			}
			t.Logf("screenshot: %s", shot)
			logMemory(t, h)
		}
	}
	for name, dom := range doms {
		if n := attrInt(t, tag(dom, "body"), "data-updates"); n < 1 {
			t.Errorf("%s: the page's script never swapped in fresh charts (data-updates %d)", name, n)
		}
	}
	checkCharts(t, doms)
}

// TestRecordedHistoryCharts: the recorded history, rendered by the server
// alone (no browser), draws what TestStatusPageInChromium looks for, so a
// fixture recorded from a demo run that went wrong fails here, everywhere.
func TestRecordedHistoryCharts(t *testing.T) {
	doms := map[string]string{}
	for moment, path := range historyFiles {
		var b strings.Builder
		ui.Render(&b, readHistory(t, path))
		doms[moment] = b.String()
	}
	checkCharts(t, doms)
}

// checkCharts checks the charts of the page at the two moments (doms'
// "before" and "after"): every chart there, carol's weight line growing
// and moving, her loss part 0 before the loss scenario and above it after.
func checkCharts(t *testing.T, doms map[string]string) {
	t.Helper()
	before, after := doms["before"], doms["after"]
	for name, dom := range doms {
		for _, id := range []string{"weight-shop-carol", "fraction-shop-carol", "loss-shop-carol", "conns-shop-carol",
			"conns-cluster-wasmember05", "bandwidth-virtual_server-shop", "lconns-instance-demo"} {
			if !strings.Contains(dom, `id="`+id+`"`) {
				t.Errorf("%s: no chart %s", name, id)
			}
		}
	}
	effB, effA := series(t, before, "weight-shop-carol", "effective"), series(t, after, "weight-shop-carol", "effective")
	if attrInt(t, effB, "data-n") < 2 || attrInt(t, effA, "data-n") <= attrInt(t, effB, "data-n") {
		t.Errorf("carol's effective weight has %d points, then %d: the plot does not grow", attrInt(t, effB, "data-n"), attrInt(t, effA, "data-n"))
	}
	if attr(effB, "d") == attr(effA, "d") {
		t.Error("carol's effective weight line did not move")
	}
	lossB, lossA := series(t, before, "fraction-shop-carol", "loss_part"), series(t, after, "fraction-shop-carol", "loss_part")
	if attrInt(t, lossB, "data-max") != 0 || attrInt(t, lossA, "data-max") <= 0 {
		t.Errorf("carol's loss part peaked at %s before the loss and %s after it: want 0, then more",
			attr(lossB, "data-max"), attr(lossA, "data-max"))
	}
	// The demo drops packets toward carol: weir's own sends to her are
	// lost and resent.
	if f := attr(series(t, after, "loss-shop-carol", "loss_to_target"), "data-max"); f == "0" {
		t.Error("carol's to_target loss ratio stayed 0 through the loss scenario")
	}
	if attrInt(t, series(t, after, "conns-cluster-wasmember05", "max"), "data-last") != 3 {
		t.Error("wasmember05's maxConnections 3 is not drawn")
	}
}

// waitSamples waits until the history holds n samples: the first scenario
// can end within one sampling interval.
func waitSamples(t *testing.T, url string, n int) {
	t.Helper()
	testutil.Eventually(t, 10*time.Second, func() bool {
		resp, err := http.Get(url)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var h api.History
		if json.NewDecoder(resp.Body).Decode(&h) != nil || len(h.Targets) == 0 {
			return false
		}
		return len(h.Targets[0].At) >= n
	}, "the history to hold %d samples", n)
}

// logMemory says what the history's rings cost for the demo's
// configuration at the default length.
func logMemory(t *testing.T, h api.History) {
	n := h.Capacity
	bytes := n*8 + len(h.Targets)*n*ui.TargetSampleBytes + len(h.Levels)*n*ui.LevelSampleBytes + len(h.Refusals)*n*ui.RefusalSampleBytes
	t.Logf("history: %d samples × (%d target, %d level, %d refusal series) = %d bytes of rings", n, len(h.Targets), len(h.Levels), len(h.Refusals), bytes)
}

func readHistory(t *testing.T, path string) api.History {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (record it with -record-history)", err)
	}
	var h api.History
	if err := json.Unmarshal(b, &h); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return h
}

// recordDemoHistory runs the demo with its status page and records the
// history the page draws after the weighted distribution and after the
// loss scenario.
func recordDemoHistory(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var url string
	recorded := map[string]bool{}
	record := func(moment string) {
		h := fetchHistory(t, url)
		b, err := json.MarshalIndent(h, "", " ")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(historyFiles[moment], append(b, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
		recorded[moment] = true
	}
	_, err := Run(ctx, Options{
		UI:      "127.0.0.1:0",
		Serving: func(u string) { url = strings.TrimSuffix(u, "/ui") + "/history" },
		AfterScenario: func(r Result) {
			switch r.Scenario {
			case "weighted distribution":
				waitSamples(t, url, 2)
				record("before")
			case "loss moves weight":
				record("after")
				cancel() // the ToS scenario shows nothing new on the page
			}
		},
	})
	if err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	if !recorded["before"] || !recorded["after"] {
		t.Fatalf("the demo did not reach the loss scenario: recorded %v", recorded)
	}
}

func fetchHistory(t *testing.T, url string) api.History {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var h api.History
	if err := json.NewDecoder(resp.Body).Decode(&h); err != nil {
		t.Fatal(err)
	}
	return h
}

func chromiumArgs(t *testing.T) []string {
	return []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
		"--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
		"--user-data-dir=" + t.TempDir(), "--virtual-time-budget=4000"}
}

func dumpDOM(t *testing.T, ctx context.Context, browser, url string) string {
	t.Helper()
	cmd := exec.CommandContext(ctx, browser, append(chromiumArgs(t), "--dump-dom", url)...)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("chromium --dump-dom %s: %v", url, err)
	}
	return string(out)
}

func screenshot(t *testing.T, ctx context.Context, browser, url, path string) {
	t.Helper()
	abs, err := filepath.Abs(path)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, browser, append(chromiumArgs(t), "--window-size=1540,1500", "--screenshot="+abs, url)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("chromium --screenshot: %v\n%s", err, out)
	}
	if fi, err := os.Stat(abs); err != nil || fi.Size() < 10<<10 {
		t.Fatalf("screenshot %s: %v (%v bytes)", abs, err, fi)
	}
}

var pathTag = regexp.MustCompile(`<path [^>]*>`)

// series finds the path of one series in one chart of the DOM.
func series(t *testing.T, dom, chart, name string) string {
	t.Helper()
	i := strings.Index(dom, `id="`+chart+`"`)
	if i < 0 {
		t.Fatalf("no chart %s", chart)
	}
	fig := dom[i:]
	if j := strings.Index(fig, "</figure>"); j >= 0 {
		fig = fig[:j]
	}
	for _, p := range pathTag.FindAllString(fig, -1) {
		if attr(p, "data-series") == name {
			return p
		}
	}
	t.Fatalf("chart %s has no series %s", chart, name)
	return ""
}

func tag(dom, name string) string {
	i := strings.Index(dom, "<"+name)
	if i < 0 {
		return ""
	}
	j := strings.Index(dom[i:], ">")
	return dom[i : i+j+1]
}

func attr(tag, name string) string {
	m := regexp.MustCompile(`\s` + regexp.QuoteMeta(name) + `="([^"]*)"`).FindStringSubmatch(tag)
	if m == nil {
		return ""
	}
	return m[1]
}

func attrInt(t *testing.T, tag, name string) int {
	t.Helper()
	v := attr(tag, name)
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		t.Fatalf("%s=%q in %.200s: %v", name, v, tag, err)
	}
	return int(f)
}
