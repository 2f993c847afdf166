package appliance_test

import (
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"weir/cmd/weir/internal/appliance"
	"weir/cmd/weir/internal/lab"
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

func TestReloaderFollowsTheFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "weir.yaml")
	writeConfig(t, path, strings.Replace(reloadYAML, "%d", "1", 1))
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	l := newLab(t, cfg, lab.Options{})
	r := appliance.NewReloader(l.App, path, config.Load)
	var swapped atomic.Int32
	r.OnReload = func(*policy.Config) { swapped.Add(1) }
	if r.Changed() {
		t.Fatal("unchanged file reported changed")
	}

	hup, stop := make(chan struct{}), make(chan struct{})
	done := make(chan struct{})
	go func() { r.Loop(hup, stop); close(done) }()
	defer func() { close(stop); <-done }()

	// A changed file is picked up by the refresh interval.
	writeConfig(t, path, strings.Replace(reloadYAML, "%d", "7", 1))
	waitFor(t, func() bool { return l.App.Status().Generation == 2 })
	if w := l.App.Config().Services[0].Targets[0].Weight; w != 7 {
		t.Fatalf("weight after reload %d, want 7", w)
	}
	// A broken file is rejected whole: the old config stays, status says why.
	writeConfig(t, path, "services: [{name: web, port: 0}]\n")
	waitFor(t, func() bool { return l.App.Status().ReloadError != nil })
	st := l.App.Status()
	if st.Generation != 2 || !strings.Contains(st.ReloadError.Err, "weir.yaml:1:") {
		t.Fatalf("after a broken file: generation %d, error %+v", st.Generation, st.ReloadError)
	}
	// SIGHUP reloads whatever the file holds.
	writeConfig(t, path, strings.Replace(reloadYAML, "%d", "3", 1))
	hup <- struct{}{}
	waitFor(t, func() bool { return l.App.Status().Generation == 3 })
	if st := l.App.Status(); st.ReloadError != nil {
		t.Errorf("reload error left after a good reload: %+v", st.ReloadError)
	}
	waitFor(t, func() bool { return swapped.Load() >= 2 })
	if swapped.Load() < 2 {
		t.Errorf("OnReload called %d times, want ≥ 2", swapped.Load())
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached in 5 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
