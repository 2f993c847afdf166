package main

import (
	"context"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"weir/bench"
	"weir/cmd/weir/internal/lab"
	"weir/internal/testutil"
	"weir/policy"
	"weir/policy/config"
)

const reloadYAML = `services:
  - name: web
    vips: [198.19.0.80]
    port: 80
    protocol: http
    targets:
      - {name: t1, address: "198.19.1.10:8080", weight: %d, via: netstack}
balancer:
  refreshInterval: 20ms
`

func writeConfig(t *testing.T, path, text string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}

func reloadLab(t *testing.T, text string) (*lab.Lab, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "weir.yaml")
	writeConfig(t, path, text)
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	l, err := lab.New(cfg, lab.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l, path
}

// startLoop runs r.Loop until the test ends.
func startLoop(t *testing.T, r *Reloader) chan<- struct{} {
	hup, stop := make(chan struct{}), make(chan struct{})
	done := make(chan struct{})
	go func() { r.Loop(hup, stop); close(done) }()
	t.Cleanup(func() { close(stop); <-done })
	return hup
}

func TestReloaderFollowsTheFile(t *testing.T) {
	l, path := reloadLab(t, strings.Replace(reloadYAML, "%d", "1", 1))
	r := NewReloader(l.App, path, config.Parser{}.Parse)
	r.Settle = 20 * time.Millisecond
	var swapped atomic.Int32
	r.OnReload = func(*policy.Config) { swapped.Add(1) }
	if r.Changed() {
		t.Fatal("unchanged file reported changed")
	}
	hup := startLoop(t, r)

	// A changed file is picked up by the refresh interval. os.WriteFile
	// truncates, then writes: the reloader must never take the empty file
	// in between, which would be one more generation and no service.
	writeConfig(t, path, strings.Replace(reloadYAML, "%d", "7", 1))
	testutil.Eventually(t, 5*time.Second, func() bool { return l.App.Status().Generation >= 2 }, "reload of the changed file")
	if g := l.App.Status().Generation; g != 2 {
		t.Fatalf("generation %d after one change, want 2", g)
	}
	if w := l.App.Config().Services[0].Targets[0].Weight; w != 7 {
		t.Fatalf("weight after reload %d, want 7", w)
	}
	// A broken file is rejected whole: the old config stays, status says why.
	writeConfig(t, path, "services: [{name: web, port: 0}]\n")
	testutil.Eventually(t, 5*time.Second, func() bool { return l.App.Status().ReloadError != nil }, "broken file reported")
	st := l.App.Status()
	if st.Generation != 2 || !strings.Contains(st.ReloadError.Err, "weir.yaml:1:") {
		t.Fatalf("after a broken file: generation %d, error %+v", st.Generation, st.ReloadError)
	}
	// SIGHUP reloads whatever the file holds (the refresh may see the
	// change first: then SIGHUP reloads the same content once more).
	writeConfig(t, path, strings.Replace(reloadYAML, "%d", "3", 1))
	hup <- struct{}{}
	testutil.Eventually(t, 5*time.Second, func() bool { return l.App.Status().Generation >= 3 }, "SIGHUP reload")
	if w := l.App.Config().Services[0].Targets[0].Weight; w != 3 {
		t.Fatalf("weight after SIGHUP %d, want 3", w)
	}
	if st := l.App.Status(); st.ReloadError != nil {
		t.Errorf("reload error left after a good reload: %+v", st.ReloadError)
	}
	testutil.Eventually(t, 5*time.Second, func() bool { return swapped.Load() >= 2 }, "OnReload called %d times, want ≥ 2", swapped.Load())
}

// TestReloaderRefusesToRemoveEveryService: an empty file (or one whose
// services are gone) is refused while services run, unless it says
// noServices: true.
func TestReloaderRefusesToRemoveEveryService(t *testing.T) {
	l, path := reloadLab(t, strings.Replace(reloadYAML, "%d", "1", 1))
	r := NewReloader(l.App, path, config.Parser{}.Parse)
	r.Settle = time.Millisecond
	for _, text := range []string{"", "# emptied\n", "balancer: {refreshInterval: 1s}\n"} {
		writeConfig(t, path, text)
		err := r.Reload()
		if err == nil || !strings.Contains(err.Error(), "noServices: true") {
			t.Fatalf("%q: reload error %v, want a refusal naming noServices", text, err)
		}
		st := l.App.Status()
		if st.Generation != 1 || len(l.App.Config().Services) != 1 || st.ReloadError == nil || !strings.Contains(st.ReloadError.Err, "no service") {
			t.Fatalf("%q: generation %d, %d services, reload error %+v", text, st.Generation, len(l.App.Config().Services), st.ReloadError)
		}
	}
	writeConfig(t, path, "noServices: true\n")
	if err := r.Reload(); err != nil {
		t.Fatalf("noServices: true refused: %v", err)
	}
	if n := len(l.App.Config().Services); n != 0 || l.App.Status().Generation != 2 {
		t.Fatalf("after noServices: true: %d services, generation %d", n, l.App.Status().Generation)
	}
	// From no services, an empty file removes nothing: it loads.
	writeConfig(t, path, "")
	if err := r.Reload(); err != nil {
		t.Fatalf("empty file after an empty config: %v", err)
	}
}

// TestReloaderWaitsForTheFileToSettle: a file that changes between two
// reads is not taken; once it stops changing it is.
func TestReloaderWaitsForTheFileToSettle(t *testing.T) {
	l, path := reloadLab(t, strings.Replace(reloadYAML, "%d", "1", 1))
	r := NewReloader(l.App, path, config.Parser{}.Parse)
	// The writer replaces the file every 2 ms; the settle time is far
	// longer than a writer stalled by a loaded 2-core host (20 ms was not:
	// a stalled writer let the file read as settled).
	r.Settle = 150 * time.Millisecond
	// A reload that took the file is right only if the writer really paused
	// for a settle time (a 2-core host under load can starve it): then the
	// round is run again, up to a few times.
	var gen int64
	for round := 1; ; round++ {
		gen = l.App.Status().Generation
		maxGap, err := reloadWhileRewriting(t, r, path)
		if err != nil && strings.Contains(err.Error(), "kept changing") {
			break
		}
		if err == nil && maxGap >= r.Settle && round < 5 {
			t.Logf("round %d: the writer stalled %v (settle %v): the file was settled, again", round, maxGap, r.Settle)
			continue
		}
		t.Fatalf("reload of a file changing every 2 ms: %v (longest pause between writes %v), want a refusal", err, maxGap)
	}
	if g := l.App.Status().Generation; g != gen {
		t.Fatalf("generation %d after a refused reload, want %d", g, gen)
	}
	if !r.Changed() {
		t.Fatal("a refused unsettled file is remembered as seen: it would never be retried")
	}
	if err := r.Reload(); err != nil {
		t.Fatalf("reload of the settled file: %v", err)
	}
	if g := l.App.Status().Generation; g != gen+1 {
		t.Fatalf("generation %d after the settled reload, want %d", g, gen+1)
	}
}

// reloadWhileRewriting runs r.Reload while the file at path is replaced
// every 2 ms (whole, by rename: every read sees a complete file, but never
// the same one twice); it returns the reload's error and the longest pause
// the writer actually made between two replacements.
func reloadWhileRewriting(t *testing.T, r *Reloader, path string) (time.Duration, error) {
	t.Helper()
	stop, done := make(chan struct{}), make(chan struct{})
	var maxGap time.Duration
	go func() {
		defer close(done)
		tmp := path + ".tmp"
		last := time.Now()
		for i := 2; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			writeConfig(t, tmp, strings.Replace(reloadYAML, "%d", "1", 1)+"#"+strconv.Itoa(i)+"\n")
			if err := os.Rename(tmp, path); err != nil {
				t.Error(err)
				return
			}
			now := time.Now()
			maxGap = max(maxGap, now.Sub(last))
			last = now
			time.Sleep(2 * time.Millisecond)
		}
	}()
	err := r.Reload()
	close(stop)
	<-done
	return maxGap, err
}

// TestReloadSurvivesTruncateThenWrite is issue 13's probe: the config is
// rewritten in place (truncate, pause, write in two chunks) in a loop while
// refreshInterval: 1s reloads it and a client loop runs. Not one request
// fails; the changed files are reloaded; the empty ones are refused. A
// 30 s soak judged against a writer's real pauses, so of the soak tier
// (make soak): a loaded host starved the writer past the settle time
// three times in the history.
func TestReloadSurvivesTruncateThenWrite(t *testing.T) {
	if testing.Short() {
		t.Skip("skipping: a 30 s reload soak (make soak runs it)")
	}
	const soak = 30 * time.Second
	text := func(w int) string {
		return strings.Replace(strings.Replace(reloadYAML, "%d", string(rune('0'+w)), 1), "20ms", "1s", 1)
	}
	l, path := reloadLab(t, text(1))
	r := NewReloader(l.App, path, config.Parser{}.Parse)
	startLoop(t, r)

	ctx, cancel := context.WithTimeout(context.Background(), soak)
	defer cancel()
	writes := make(chan int, 1)
	go func() {
		rng := rand.New(rand.NewPCG(1, 2))
		n := 0
		defer func() { writes <- n }()
		for w := 2; ctx.Err() == nil; w = w%9 + 1 {
			f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0o644)
			if err != nil {
				t.Error(err)
				return
			}
			// Empty about half the time, often longer than Settle: a
			// reload that took the empty file would take every VIP down,
			// and one that waits for it to settle must still refuse it.
			time.Sleep(time.Duration(rng.IntN(400)) * time.Millisecond)
			b := []byte(text(w))
			cut := rng.IntN(len(b))
			f.Write(b[:cut])
			time.Sleep(time.Duration(rng.IntN(20)) * time.Millisecond)
			f.Write(b[cut:])
			f.Close()
			n++
			// Mostly rewritten again soon; every fourth file stays long
			// enough for a refresh tick to see it settled and load it.
			if n%4 == 0 {
				time.Sleep(1500 * time.Millisecond)
			} else {
				time.Sleep(time.Duration(100+rng.IntN(200)) * time.Millisecond)
			}
		}
	}()
	// Loads of a bounded number of requests, so that the end of the soak
	// never cuts a request short.
	var res bench.Result
	for ctx.Err() == nil {
		b := bench.Load{Dial: l.Dial, Addr: "198.19.0.80:80", Clients: 2, Requests: 100, Duration: time.Minute}.Run(context.Background())
		res.Requests += b.Requests
		res.OK += b.OK
		res.Failed += b.Failed + b.Reset + b.Refused503
		if len(res.Errors) < 5 {
			res.Errors = append(res.Errors, b.Errors...)
		}
	}
	n := <-writes
	st := l.App.Status()
	t.Logf("%v: %d rewrites, %d reloads, %d requests OK", soak, n, st.Generation-1, res.OK)
	if res.OK == 0 || res.OK != res.Requests {
		t.Fatalf("%d of %d requests OK during the rewrites (%d failed): %v", res.OK, res.Requests, res.Failed, res.Errors)
	}
	if len(l.App.Config().Services) != 1 {
		t.Fatalf("running config has %d services", len(l.App.Config().Services))
	}
	if st.Generation < 3 {
		t.Errorf("only %d reloads in %v of rewrites", st.Generation-1, soak)
	}
}

// twoTargets is a config whose prefix up to its second target is a valid
// config of one target: what a reload catching a writer in mid-file takes.
const twoTargets = `balancer:
  refreshInterval: 20ms
services:
  - name: web
    vips: [198.19.0.80]
    port: 80
    protocol: http
    targets:
      - {name: t1, address: "198.19.1.10:8080", weight: %d, via: netstack}
`
const secondTarget = `      - {name: t2, address: "198.19.1.11:8080", weight: 1, via: netstack}
`

// TestReloadNeverTakesAPrefix is issue 23's Deliver 5: a writer that
// rewrites the file in place and pauses 300 ms in mid-file (after a prefix
// that is a valid config of one of the two targets) never has that prefix
// loaded: the reload waits for the writer's close (inotify), not for a
// quiet period it cannot tell from the end. Every write is loaded whole.
// With the settle rule alone (NoWatch), the same writer got the prefix
// loaded 2 of 8 times in the probe: that subtest logs its count
// (the figure the closing note compares) and checks every write is loaded
// whole in the end.
func TestReloadNeverTakesAPrefix(t *testing.T) {
	for _, noWatch := range []bool{false, true} {
		t.Run(map[bool]string{false: "inotify", true: "settle rule"}[noWatch], func(t *testing.T) {
			if w, err := watchFile(filepath.Join(t.TempDir(), "x")); err != nil {
				if !noWatch {
					t.Skipf("skipping: %v", err)
				}
			} else {
				w.Close()
			}
			text := func(w int) string { return strings.Replace(twoTargets, "%d", strconv.Itoa(w), 1) + secondTarget }
			l, path := reloadLab(t, text(1))
			r := NewReloader(l.App, path, config.Parser{}.Parse)
			r.NoWatch = noWatch
			var prefixes, loads atomic.Int32
			r.OnReload = func(cfg *policy.Config) {
				loads.Add(1)
				if len(cfg.Services[0].Targets) != 2 {
					prefixes.Add(1)
				}
			}
			up := make(chan bool, 1)
			r.watching = func(ok bool) { up <- ok }
			startLoop(t, r)
			if ok := <-up; ok == noWatch {
				t.Fatalf("watch up %v with NoWatch %v", ok, noWatch)
			}
			const writes = 8
			for w := 2; w < 2+writes; w++ {
				f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0o644)
				if err != nil {
					t.Fatal(err)
				}
				full := text(w)
				cut := len(full) - len(secondTarget)
				f.WriteString(full[:cut])
				time.Sleep(300 * time.Millisecond) // the writer's pause: the point of the test
				f.WriteString(full[cut:])
				f.Close()
				ok := testutil.Within(5*time.Second, func() bool {
					c := l.App.Config().Services[0]
					return len(c.Targets) == 2 && c.Targets[0].Weight == w
				})
				if !ok {
					t.Fatalf("write %d never loaded whole", w)
				}
			}
			t.Logf("%d writes paused 300 ms in mid-file: %d reloads, %d of them a prefix", writes, loads.Load(), prefixes.Load())
			if noWatch {
				return
			}
			if n := prefixes.Load(); n != 0 {
				t.Errorf("%d of %d writes had their prefix loaded", n, writes)
			}
		})
	}
}
