package demo

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"weir/cmd/weir/api"
	"weir/cmd/weir/internal/ui"
	"weir/internal/testutil"
)

// TestStatusPageInChromium looks at the status page as a person does: the
// demo's appliance serves /ui, headless Chromium loads it (running its
// script, which swaps in fresh charts), and the DOM it built must hold the
// plots with data points, carol's loss part rising once the demo's loss
// scenario ran. A screenshot goes to the test's artifact directory
// (go test -artifacts keeps it) and, with WEIR_UI_PNG=path, there too
// (docs/ui.png in the README was made so).
func TestStatusPageInChromium(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the demo's scenarios: not in -short")
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
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var url string
	doms := map[string]string{}
	_, err := Run(ctx, Options{
		UI:      "127.0.0.1:0",
		Serving: func(u string) { url = u },
		AfterScenario: func(r Result) {
			switch r.Scenario {
			case "weighted distribution":
				waitSamples(t, strings.TrimSuffix(url, "/ui")+"/history", 2)
				doms["before"] = dumpDOM(t, ctx, browser, url)
			case "loss moves weight":
				doms["after"] = dumpDOM(t, ctx, browser, url)
				shot := filepath.Join(t.ArtifactDir(), "ui.png")
				screenshot(t, ctx, browser, url, shot)
				if p := os.Getenv("WEIR_UI_PNG"); p != "" {
					screenshot(t, ctx, browser, url, p)
				}
				t.Logf("screenshot: %s", shot)
				logMemory(t, strings.TrimSuffix(url, "/ui")+"/history")
				cancel() // the ToS scenario shows nothing new on the page
			}
		},
	})
	if err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	before, after := doms["before"], doms["after"]
	if before == "" || after == "" {
		t.Fatalf("the demo did not reach the loss scenario (page at %q)", url)
	}
	for name, dom := range doms {
		if n := attrInt(t, tag(dom, "body"), "data-updates"); n < 1 {
			t.Errorf("%s: the page's script never swapped in fresh charts (data-updates %d)", name, n)
		}
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
func logMemory(t *testing.T, url string) {
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var h api.History
	if err := json.NewDecoder(resp.Body).Decode(&h); err != nil {
		t.Fatal(err)
	}
	n := h.Capacity
	bytes := n*8 + len(h.Targets)*n*ui.TargetSampleBytes + len(h.Levels)*n*ui.LevelSampleBytes + len(h.Refusals)*n*ui.RefusalSampleBytes
	t.Logf("history: %d samples × (%d target, %d level, %d refusal series) = %d bytes of rings", n, len(h.Targets), len(h.Levels), len(h.Refusals), bytes)
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
