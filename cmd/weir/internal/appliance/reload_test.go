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

// writeConfig replaces the file whole (a rename), the way an editor or a
// config manager does: the reloader polls every 20 ms and must never read a
// file half written.
func writeConfig(t *testing.T, path, text string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
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
	testutil.Eventually(t, 5*time.Second, func() bool { return l.App.Status().Generation == 2 }, "the changed file reloaded (generation 2)")
	if w := l.App.Config().Services[0].Targets[0].Weight; w != 7 {
		t.Fatalf("weight after reload %d, want 7", w)
	}
	// A broken file is rejected whole: the old config stays, status says why.
	writeConfig(t, path, "services: [{name: web, port: 0}]\n")
	testutil.Eventually(t, 5*time.Second, func() bool { return l.App.Status().ReloadError != nil }, "the broken file rejected")
	st := l.App.Status()
	if st.Generation != 2 || !strings.Contains(st.ReloadError.Err, "weir.yaml:1:") {
		t.Fatalf("after a broken file: generation %d, error %+v", st.Generation, st.ReloadError)
	}
	// A fixed file is picked up again and clears the error.
	writeConfig(t, path, strings.Replace(reloadYAML, "%d", "3", 1))
	testutil.Eventually(t, 5*time.Second, func() bool { return l.App.Status().Generation == 3 }, "the fixed file reloaded (generation 3)")
	if st := l.App.Status(); st.ReloadError != nil {
		t.Errorf("reload error left after a good reload: %+v", st.ReloadError)
	}
	// SIGHUP reloads whatever the file holds, changed or not. (The file is
	// unchanged here, so the refresh cannot be the one reloading it.)
	hup <- struct{}{}
	testutil.Eventually(t, 5*time.Second, func() bool { return l.App.Status().Generation == 4 }, "SIGHUP reloaded the unchanged file (generation 4)")
	if w := l.App.Config().Services[0].Targets[0].Weight; w != 3 {
		t.Errorf("weight after SIGHUP %d, want 3", w)
	}
	testutil.Eventually(t, 5*time.Second, func() bool { return swapped.Load() == 3 }, "OnReload called for each of the 3 reloads")
	if st := l.App.Status(); st.Generation != 4 {
		t.Errorf("generation %d after one SIGHUP, want 4 (a reload too many?)", st.Generation)
	}
}
