// Package weirproc starts the real weir binary (`weir run`) for a test and
// talks to it: the one starter the end-to-end tests (cmd/weir, in network
// namespaces) and the VM scenarios (vmtest, in the VM's own namespace)
// share. It is imported only by _test files.
package weirproc

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"weir/internal/netns"
)

// Options say how to start weir. Binary and Config are required.
type Options struct {
	// Binary is the weir executable.
	Binary string
	// Config is the path of the configuration file (-c).
	Config string
	// TUN is the TUN device's name; "" means weir0.
	TUN string
	// TUNAddrs are the TUN's own addresses; nil means 198.18.0.1/32.
	TUNAddrs []string
	// Admin is the admin API's listen address; "" means 127.0.0.1:0 (the
	// address weir picked is read back from its ready file).
	Admin string
	// Extra are further flags of `weir run`.
	Extra []string
	// NS runs weir inside that network namespace; nil runs it in the test
	// process's own.
	NS *netns.NS
	// Ready bounds the wait for the ready file; zero means 30 s.
	Ready time.Duration
}

// Proc is a running `weir run`.
type Proc struct {
	// Admin is the admin API's address, from the ready file.
	Admin string
	// HTTP reaches the admin API (from inside the namespace, if any).
	HTTP *http.Client
	// LogPath is the file weir's stdout and stderr go to.
	LogPath string

	t       testing.TB
	cmd     *exec.Cmd
	done    chan struct{} // closed when the process has exited
	waitErr error         // Wait's result, once done is closed
}

// Start starts weir and returns once it wrote its ready file. A cleanup
// kills weir if it still runs when the test ends and, if the test failed,
// logs the end of weir's output.
func Start(t testing.TB, o Options) *Proc {
	t.Helper()
	dir := t.TempDir()
	ready := filepath.Join(dir, "ready")
	p := &Proc{t: t, LogPath: filepath.Join(dir, "weir.log"), done: make(chan struct{})}
	logf, err := os.Create(p.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	if o.TUN == "" {
		o.TUN = "weir0"
	}
	if o.TUNAddrs == nil {
		o.TUNAddrs = []string{"198.18.0.1/32"}
	}
	if o.Admin == "" {
		o.Admin = "127.0.0.1:0"
	}
	if o.Ready == 0 {
		o.Ready = 30 * time.Second
	}
	args := []string{"run", "-c", o.Config, "--tun", o.TUN}
	for _, a := range o.TUNAddrs {
		args = append(args, "--tun-addr", a)
	}
	args = append(args, "--admin", o.Admin, "--ready-file", ready, "--log-format", "json")
	p.cmd = exec.Command(o.Binary, append(args, o.Extra...)...)
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	// weir dies with the thread that started it, a locked thread that
	// lives until weir exits: a crashed test binary leaves no weir behind.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	startErr := make(chan error, 1)
	run := func() error {
		defer close(p.done)
		defer logf.Close()
		if err := p.cmd.Start(); err != nil {
			startErr <- err
			return nil
		}
		startErr <- nil
		p.waitErr = p.cmd.Wait()
		return nil
	}
	if o.NS != nil {
		go o.NS.Do(run) // the child inherits the namespace of the thread that forks it
	} else {
		go func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			run()
		}()
	}
	if err := <-startErr; err != nil {
		t.Fatalf("start weir: %v", err)
	}
	started := time.Now()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			p.cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("weir log (%s), its end:\n%s", p.LogPath, p.Tail(16<<10))
		}
	})
	tr := &http.Transport{DisableKeepAlives: true}
	if o.NS != nil {
		tr.DialContext = o.NS.Dial
	}
	p.HTTP = &http.Client{Timeout: 5 * time.Second, Transport: tr}

	deadline := time.After(o.Ready)
	for {
		// run writes the file in one write ending in a newline: without
		// it, the file is still being written.
		if b, err := os.ReadFile(ready); err == nil && bytes.HasSuffix(b, []byte("\n")) {
			p.Admin = strings.TrimSpace(string(b))
			break
		}
		select {
		case <-p.done:
			t.Fatalf("weir exited before it was ready: %v\n%s", p.waitErr, p.Tail(16<<10))
		case <-deadline:
			t.Fatalf("weir not ready after %v\n%s", o.Ready, p.Tail(16<<10))
		case <-time.After(20 * time.Millisecond):
		}
	}
	t.Logf("weir ready in %v, admin %s", time.Since(started).Round(time.Millisecond), p.Admin)
	return p
}

// Log is weir's output so far.
func (p *Proc) Log() string {
	b, _ := os.ReadFile(p.LogPath)
	return string(b)
}

// Tail is the last n bytes of weir's output.
func (p *Proc) Tail(n int) string {
	s := p.Log()
	return s[max(0, len(s)-n):]
}

// Signal sends s to weir.
func (p *Proc) Signal(s os.Signal) error { return p.cmd.Process.Signal(s) }

// Done is closed once weir has exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Wait waits up to d for weir to exit and returns its exit code.
func (p *Proc) Wait(d time.Duration) (int, error) {
	select {
	case <-p.done:
	case <-time.After(d):
		return -1, fmt.Errorf("weir still running after %v", d)
	}
	if p.waitErr == nil {
		return 0, nil
	}
	var ee *exec.ExitError
	if errors.As(p.waitErr, &ee) {
		return ee.ExitCode(), nil
	}
	return -1, p.waitErr
}

// Get fetches an admin API path.
func (p *Proc) Get(path string) (int, []byte, error) {
	resp, err := p.HTTP.Get("http://" + p.Admin + path)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// GetJSON fetches an admin API path that must answer 200 and decodes its
// JSON into v.
func (p *Proc) GetJSON(path string, v any) error {
	code, b, err := p.Get(path)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if code != http.StatusOK {
		return fmt.Errorf("%s: status %d: %s", path, code, b)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%s does not decode: %w\n%s", path, err, b)
	}
	return nil
}
