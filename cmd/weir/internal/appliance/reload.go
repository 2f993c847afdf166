package appliance

import (
	"bytes"
	"crypto/sha256"
	"os"
	"time"

	"weir/policy"
)

// Reloader reloads an appliance's configuration from a file: on demand
// (SIGHUP) and, when the config's Balancer.RefreshInterval is set, whenever
// the file's content changes. A file that fails to parse or validate is
// rejected whole: it is logged, /status shows the error, and the running
// configuration stays.
type Reloader struct {
	App  *Appliance
	Path string
	// Load parses and compiles a config file (config.Load).
	Load func(path string) (*policy.Config, error)
	// OnReload, when set, is called with each configuration swapped in
	// (weir run routes new VIPs through its TUN).
	OnReload func(*policy.Config)

	sum []byte // hash of the content last loaded (or rejected)
}

// NewReloader remembers the content of path as the one already running.
func NewReloader(app *Appliance, path string, load func(string) (*policy.Config, error)) *Reloader {
	r := &Reloader{App: app, Path: path, Load: load}
	if b, err := os.ReadFile(path); err == nil {
		s := sha256.Sum256(b)
		r.sum = s[:]
	}
	return r
}

// Reload loads the file and swaps it in, whatever its content.
func (r *Reloader) Reload() error {
	b, err := os.ReadFile(r.Path)
	if err == nil {
		s := sha256.Sum256(b)
		r.sum = s[:]
	}
	cfg, err := r.Load(r.Path)
	if err != nil {
		r.App.ReloadFailed(err)
		return err
	}
	if err := r.App.Reload(cfg); err != nil {
		return err
	}
	if r.OnReload != nil {
		r.OnReload(r.App.Config())
	}
	return nil
}

// Changed reports whether the file's content differs from the last one
// loaded or rejected.
func (r *Reloader) Changed() bool {
	b, err := os.ReadFile(r.Path)
	if err != nil {
		return false
	}
	s := sha256.Sum256(b)
	return !bytes.Equal(s[:], r.sum)
}

// Loop runs in its own goroutine until stop closes: it reloads on every
// value from hup (SIGHUP) and, every RefreshInterval of the running config,
// when the file changed.
func (r *Reloader) Loop(hup <-chan struct{}, stop <-chan struct{}) {
	const idle = time.Second // how often to look at RefreshInterval when it is off
	for {
		every := r.App.Config().Balancer.RefreshInterval
		wait := every
		if wait <= 0 {
			wait = idle
		}
		t := time.NewTimer(wait)
		select {
		case <-stop:
			t.Stop()
			return
		case <-hup:
			t.Stop()
			r.Reload()
		case <-t.C:
			if every > 0 && r.Changed() {
				r.Reload()
			}
		}
	}
}
