package main

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"io"
	"os"
	"time"

	"weir/policy"
	"weir/policy/config"
)

// DefaultSettle is how long a config file must stay unchanged before a
// reload takes it (Reloader.Settle).
const DefaultSettle = 100 * time.Millisecond

// settleTries bounds how many Settle intervals a reload waits for a file
// that keeps changing before it gives up (and tries again next time).
const settleTries = 10

// Reloadable is what a Reloader swaps configurations into: an
// *appliance.Appliance.
type Reloadable interface {
	// Config returns the configuration in force.
	Config() *policy.Config
	// Reload swaps cfg in, or returns why not (and keeps the running one).
	Reload(cfg *policy.Config) error
	// ReloadFailed records a file that could not be taken, for /status.
	ReloadFailed(err error)
}

// Reloader reloads an appliance's configuration from a file: on demand
// (SIGHUP) and, when the config's Balancer.RefreshInterval is set, whenever
// the file's content changes.
//
// A reload never swaps in a file caught while it is being written (an
// editor or `cat > file` truncates, then writes, and may pause between its
// writes):
//   - where inotify works (Loop watches the file's directory), a change is
//     taken when its writer closes the file (IN_CLOSE_WRITE) or a file is
//     renamed onto it (IN_MOVED_TO), and never while the file has been
//     modified and not closed since; no quiet period is guessed, so a
//     writer that pauses mid-file is waited for however long it pauses;
//   - elsewhere (and for a change inotify cannot see, such as a symlink
//     swapped in another directory) the settle rule: the bytes are taken
//     only when two reads Settle apart returned the same content and the
//     file was last modified at least Settle before (two reads can both
//     land between a truncate and its write); a pause longer than Settle
//     defeats it, which is why the watch comes first;
//   - it parses exactly the bytes it hashed, never a second read of the file;
//   - it refuses a config that would remove every running service unless the
//     file says `noServices: true`.
//
// A file refused for any of these reasons, or one that fails to parse or
// validate, is rejected whole: it is logged, /status shows the error
// (api.ReloadError), and the running configuration stays.
type Reloader struct {
	App  Reloadable
	Path string
	// Parse parses and compiles the content of the file named name
	// (config.Parser.Parse).
	Parse func(name string, data []byte) (*policy.Config, error)
	// OnReload, when set, is called with each configuration swapped in
	// (weir run routes the new VIPs through its TUN).
	OnReload func(*policy.Config)
	// Settle is the interval between the two reads that must agree; zero
	// means DefaultSettle.
	Settle time.Duration
	// NoWatch makes Loop use the settle rule alone, as where inotify is
	// unavailable.
	NoWatch bool

	// watching, when set, hears from Loop whether its watch is up, once
	// it is set up (tests wait for it before they write).
	watching func(bool)

	sum []byte // hash of the content last loaded (or rejected)
}

// NewReloader remembers the content of path as the one already running.
func NewReloader(app Reloadable, path string, parse func(string, []byte) (*policy.Config, error)) *Reloader {
	r := &Reloader{App: app, Path: path, Parse: parse}
	if b, _, err := readFile(path); err == nil {
		r.sum = hash(b)
	}
	return r
}

// Reload loads the file and swaps it in once its content has settled.
func (r *Reloader) Reload() error {
	data, err := r.readSettled()
	if err != nil {
		// Not remembered as seen: the next refresh tries again.
		r.App.ReloadFailed(err)
		return err
	}
	return r.load(data)
}

// reloadClosed loads the file as it is: its writer has closed it.
func (r *Reloader) reloadClosed() error {
	data, _, err := readFile(r.Path)
	if err != nil {
		r.App.ReloadFailed(err)
		return err
	}
	return r.load(data)
}

// load parses data, the file's content, and swaps it in.
func (r *Reloader) load(data []byte) error {
	r.sum = hash(data)
	cfg, err := r.Parse(r.Path, data)
	if err != nil {
		r.App.ReloadFailed(err)
		return err
	}
	if n := len(r.App.Config().Services); n > 0 && len(cfg.Services) == 0 && !cfg.NoServices {
		err := fmt.Errorf("%s defines no service: reloading it would remove all %d running; "+
			"the file may be half-written, so the running config stays (write `noServices: true` to mean it)", r.Path, n)
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

// readSettled returns the file's content once two reads Settle apart agree.
func (r *Reloader) readSettled() ([]byte, error) {
	settle := r.Settle
	if settle <= 0 {
		settle = DefaultSettle
	}
	prev, _, err := readFile(r.Path)
	if err != nil {
		return nil, err
	}
	for range settleTries {
		time.Sleep(settle)
		cur, mtime, err := readFile(r.Path)
		if err != nil {
			return nil, err
		}
		// A modification time in the future (a skewed clock, touch -d)
		// cannot say the file is quiet: content alone decides then.
		age := time.Since(mtime)
		if bytes.Equal(cur, prev) && (age >= settle || age < -time.Second) {
			return cur, nil
		}
		prev = cur
	}
	return nil, fmt.Errorf("config: %s kept changing for %v: not reloaded (the running config stays)", r.Path, settleTries*settle)
}

// Changed reports whether the file's content differs from the last one
// loaded or rejected.
func (r *Reloader) Changed() bool {
	b, _, err := readFile(r.Path)
	if err != nil {
		return false
	}
	return !bytes.Equal(hash(b), r.sum)
}

// Loop runs in its own goroutine until stop closes: it reloads on every
// value from hup (SIGHUP) and, while RefreshInterval of the running config
// is set, when the file changed: at its writer's close where inotify
// watches it, else when a check every RefreshInterval finds it changed and
// settled. With the watch, that check still runs (a change the watch
// cannot see), but never takes a file being written.
func (r *Reloader) Loop(hup <-chan struct{}, stop <-chan struct{}) {
	const idle = time.Second // how often to look at RefreshInterval when it is off
	var w *fileWatch
	if !r.NoWatch {
		if fw, err := watchFile(r.Path); err == nil {
			w = fw
			defer w.Close()
		}
	}
	var closed <-chan struct{}
	if w != nil {
		closed = w.Closed()
	}
	if r.watching != nil {
		r.watching(w != nil)
	}
	// writing: with the watch, the file is modified and not closed yet.
	writing := func() bool { return w != nil && w.Writing() }
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
			if writing() {
				r.waitClosed(closed, stop)
			}
			r.Reload()
		case <-closed:
			t.Stop()
			if every > 0 && !writing() && r.Changed() {
				r.reloadClosed()
			}
		case <-t.C:
			if every > 0 && !writing() && r.Changed() {
				if data, err := r.readSettled(); err != nil {
					r.App.ReloadFailed(err)
				} else if !writing() {
					// A writer that began meanwhile: its close reloads.
					r.load(data)
				}
			}
		}
	}
}

// waitClosed waits, at most as long as the settle rule would, for the
// writer of the file to close it: a SIGHUP in mid-write reloads the whole
// file.
func (r *Reloader) waitClosed(closed <-chan struct{}, stop <-chan struct{}) {
	settle := r.Settle
	if settle <= 0 {
		settle = DefaultSettle
	}
	t := time.NewTimer(settleTries * settle)
	defer t.Stop()
	select {
	case <-closed:
	case <-stop:
	case <-t.C:
	}
}

func hash(b []byte) []byte {
	s := sha256.Sum256(b)
	return s[:]
}

// readFile reads a file of at most config.MaxFileSize bytes and returns it
// with its modification time.
func readFile(path string) ([]byte, time.Time, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("config: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("config: %w", err)
	}
	b, err := io.ReadAll(io.LimitReader(f, config.MaxFileSize+1))
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("config: %w", err)
	}
	if len(b) > config.MaxFileSize {
		return nil, time.Time{}, fmt.Errorf("config: %s is larger than %d bytes", path, config.MaxFileSize)
	}
	return b, st.ModTime(), nil
}
