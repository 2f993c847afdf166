//go:build linux

package main

// End-to-end tests of the real `weir run` binary: every test creates its own
// network namespace (weir-e2e-<pid>-<n>), starts the built binary inside it
// with `ip netns exec`, serves real HTTP/TCP backends on 198.18.1.x on the
// namespace's loopback, and drives kernel TCP clients through the VIPs
// (198.18.0.x, fd00::x) that weir routes through its TUN. They need root,
// /dev/net/tun and ip(8), and skip with a message otherwise.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"weir/bench"
	"weir/cmd/weir/api"
)

// e2eAdmin is weir's admin address inside each test's namespace: every
// namespace has its own loopback, so a fixed port cannot collide.
const e2eAdmin = "127.0.0.1:9090"

// e2eBackendAddrs are put on each namespace's loopback for the backends.
var e2eBackendAddrs = []string{"198.18.1.1", "198.18.1.2", "198.18.1.3"}

var (
	weirBinOnce sync.Once
	weirBinDir  string
	weirBinPath string
	weirBinErr  error
	nsSeq       atomic.Int32
	reapOnce    sync.Once
)

func TestMain(m *testing.M) {
	code := m.Run()
	if weirBinDir != "" {
		os.RemoveAll(weirBinDir)
	}
	os.Exit(code)
}

// requireE2E skips the test unless it can create namespaces, TUN devices and
// run ip(8).
func requireE2E(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("skipping: the end-to-end tests run `weir run` in network namespaces and need root (CAP_NET_ADMIN)")
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		t.Skipf("skipping: end-to-end tests need /dev/net/tun: %v", err)
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skipf("skipping: end-to-end tests need ip(8) from iproute2: %v", err)
	}
}

// weirBinary builds the weir binary once per test binary.
func weirBinary(t *testing.T) string {
	t.Helper()
	weirBinOnce.Do(func() {
		weirBinDir, weirBinErr = os.MkdirTemp("", "weir-e2e-bin-")
		if weirBinErr != nil {
			return
		}
		weirBinPath = filepath.Join(weirBinDir, "weir")
		start := time.Now()
		out, err := exec.Command("go", "build", "-o", weirBinPath, ".").CombinedOutput()
		if err != nil {
			weirBinErr = fmt.Errorf("go build: %v\n%s", err, out)
			return
		}
		t.Logf("built %s in %v", weirBinPath, time.Since(start).Round(time.Millisecond))
	})
	if weirBinErr != nil {
		t.Fatal(weirBinErr)
	}
	return weirBinPath
}

// netNS is a network namespace the test created.
type netNS struct {
	name string
	h    netns.NsHandle
}

// reapStaleNetNS deletes the namespaces a killed earlier run of these tests
// left behind: weir-e2e-<pid>-<n> whose test process is gone.
func reapStaleNetNS(t *testing.T) {
	names, _ := filepath.Glob("/var/run/netns/weir-e2e-*")
	for _, path := range names {
		name := filepath.Base(path)
		var pid, n int
		if _, err := fmt.Sscanf(name, "weir-e2e-%d-%d", &pid, &n); err != nil || pid == os.Getpid() {
			continue
		}
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			continue
		}
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err == nil {
			t.Logf("deleted namespace %s left by an earlier run", name)
		} else {
			t.Logf("deleting stale namespace %s: %v: %s", name, err, out)
		}
	}
}

// newNetNS creates a namespace with its loopback up and the backend
// addresses on it; cleanup deletes it.
func newNetNS(t *testing.T) *netNS {
	t.Helper()
	reapOnce.Do(func() { reapStaleNetNS(t) })
	name := fmt.Sprintf("weir-e2e-%d-%d", os.Getpid(), nsSeq.Add(1))
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Skipf("skipping: cannot create a network namespace: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
			t.Errorf("deleting namespace %s: %v: %s", name, err, out)
		}
	})
	ip := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", append([]string{"-n", name}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	ip("link", "set", "lo", "up")
	for _, a := range e2eBackendAddrs {
		ip("addr", "add", a+"/32", "dev", "lo")
	}
	h, err := netns.GetFromName(name)
	if err != nil {
		t.Fatalf("open namespace %s: %v", name, err)
	}
	t.Cleanup(func() { h.Close() })
	return &netNS{name: name, h: h}
}

// do runs f on an OS thread inside the namespace. The thread stays locked
// and dies with its goroutine, so it never serves other goroutines from
// inside the namespace. Sockets f creates stay in the namespace.
func (n *netNS) do(f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := netns.Set(n.h); err != nil {
			errc <- fmt.Errorf("enter namespace %s: %w", n.name, err)
			return
		}
		errc <- f()
	}()
	return <-errc
}

// Dial dials from inside the namespace: a bench.DialFunc.
func (n *netNS) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := n.do(func() (err error) {
		var d net.Dialer
		c, err = d.DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// Listen listens inside the namespace.
func (n *netNS) Listen(t *testing.T, addr string) net.Listener {
	t.Helper()
	var ln net.Listener
	if err := n.do(func() (err error) {
		ln, err = net.Listen("tcp", addr)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// weirProc is a `weir run` inside a namespace.
type weirProc struct {
	t       *testing.T
	ns      *netNS
	dir     string
	cfgPath string
	logPath string
	cmd     *exec.Cmd
	started time.Time
	done    chan struct{} // closed when the process has exited
	waitErr error
	http    *http.Client
}

// startWeir creates a namespace and starts weir in it on the config in
// testdata/e2e/<cfgName>, with extra flags; it returns once weir wrote its
// ready file. Cleanup kills weir (if still running) before the namespace
// goes, and prints weir's log when the test failed.
func startWeir(t *testing.T, cfgName string, extra ...string) *weirProc {
	t.Helper()
	requireE2E(t)
	bin := weirBinary(t)
	ns := newNetNS(t)
	dir := t.TempDir()
	w := &weirProc{t: t, ns: ns, dir: dir, cfgPath: filepath.Join(dir, "weir.yaml"), logPath: filepath.Join(dir, "weir.log"),
		done: make(chan struct{})}
	w.writeConfig(cfgName)
	ready := filepath.Join(dir, "ready")
	logf, err := os.Create(w.logPath)
	if err != nil {
		t.Fatal(err)
	}
	args := append([]string{"netns", "exec", ns.name, bin, "run", "-c", w.cfgPath, "--tun", "weir0",
		"--tun-addr", "198.18.0.1/32", "--tun-addr", "fd00::1/128", "--admin", e2eAdmin,
		"--ready-file", ready, "--log-format", "json"}, extra...)
	w.cmd = exec.Command("ip", args...)
	w.cmd.Stdout, w.cmd.Stderr = logf, logf
	// weir dies with the thread that started it: a locked thread that lives
	// until weir exits, so that a crashed test binary leaves no weir behind.
	w.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	startErr := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		defer close(w.done)
		defer logf.Close()
		if err := w.cmd.Start(); err != nil {
			startErr <- err
			return
		}
		startErr <- nil
		w.waitErr = w.cmd.Wait()
	}()
	if err := <-startErr; err != nil {
		t.Fatalf("start weir: %v", err)
	}
	w.started = time.Now()
	t.Cleanup(func() {
		select {
		case <-w.done:
		default:
			w.cmd.Process.Kill()
			<-w.done
		}
		if t.Failed() {
			t.Logf("weir log (%s):\n%s", w.logPath, w.log())
		}
	})
	w.http = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DialContext: ns.Dial, DisableKeepAlives: true}}

	deadline := time.After(20 * time.Second)
	for {
		if b, err := os.ReadFile(ready); err == nil && bytes.HasSuffix(b, []byte("\n")) {
			break
		}
		select {
		case <-w.done:
			t.Fatalf("weir exited before it was ready: %v\n%s", w.waitErr, w.log())
		case <-deadline:
			t.Fatalf("weir not ready after 20s\n%s", w.log())
		case <-time.After(20 * time.Millisecond):
		}
	}
	t.Logf("weir ready in %v (namespace %s)", time.Since(w.started).Round(time.Millisecond), ns.name)
	return w
}

// writeConfig puts testdata/e2e/<name> where weir reads its config.
func (w *weirProc) writeConfig(name string) {
	w.t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "e2e", name))
	if err != nil {
		w.t.Fatal(err)
	}
	if err := os.WriteFile(w.cfgPath, b, 0o644); err != nil {
		w.t.Fatal(err)
	}
}

func (w *weirProc) signal(s os.Signal) {
	w.t.Helper()
	if err := w.cmd.Process.Signal(s); err != nil {
		w.t.Fatalf("signal %v: %v", s, err)
	}
}

// log is weir's stderr so far.
func (w *weirProc) log() string {
	b, _ := os.ReadFile(w.logPath)
	return string(b)
}

// logLine is one JSON line of weir's log: raw, and decoded (for a key
// given twice the last value wins).
type logLine struct {
	raw string
	m   map[string]any
}

// logLines are weir's JSON log lines so far.
func (w *weirProc) logLines() []logLine {
	var out []logLine
	sc := bufio.NewScanner(strings.NewReader(w.log()))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) == nil {
			out = append(out, logLine{raw: sc.Text(), m: m})
		}
	}
	return out
}

// waitLog waits up to d for a JSON log line whose message holds all of
// parts, and returns it.
func (w *weirProc) waitLog(d time.Duration, parts ...string) (logLine, bool) {
	deadline := time.Now().Add(d)
	for {
	lines:
		for _, l := range w.logLines() {
			msg, _ := l.m["message"].(string)
			for _, p := range parts {
				if !strings.Contains(msg, p) {
					continue lines
				}
			}
			return l, true
		}
		if time.Now().After(deadline) {
			return logLine{}, false
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// get fetches an admin API path from inside the namespace.
func (w *weirProc) get(path string) (int, []byte, error) {
	resp, err := w.http.Get("http://" + e2eAdmin + path)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// status fetches /status.
func (w *weirProc) status() api.Status {
	w.t.Helper()
	code, b, err := w.get("/status")
	if err != nil || code != http.StatusOK {
		w.t.Fatalf("/status: %d %v %s", code, err, b)
	}
	var st api.Status
	if err := json.Unmarshal(b, &st); err != nil {
		w.t.Fatalf("/status does not decode: %v\n%s", err, b)
	}
	return st
}

// waitStatus polls /status until ok holds, for up to d.
func (w *weirProc) waitStatus(d time.Duration, what string, ok func(api.Status) bool) api.Status {
	w.t.Helper()
	deadline := time.Now().Add(d)
	for {
		st := w.status()
		if ok(st) {
			return st
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("after %v: not %s: %+v", d, what, st)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// wait waits up to d for weir to exit and returns its exit code.
func (w *weirProc) wait(d time.Duration) (int, error) {
	select {
	case <-w.done:
	case <-time.After(d):
		return -1, fmt.Errorf("weir still running after %v", d)
	}
	if w.waitErr == nil {
		return 0, nil
	}
	var ee *exec.ExitError
	if errors.As(w.waitErr, &ee) {
		return ee.ExitCode(), nil
	}
	return -1, w.waitErr
}

// backend serves a bench.Backend named name on addr inside the namespace.
func (w *weirProc) backend(name, addr string, delay time.Duration) *bench.Backend {
	w.t.Helper()
	b := &bench.Backend{Name: name, Delay: delay}
	ln := w.ns.Listen(w.t, addr)
	go b.Serve(ln)
	w.t.Cleanup(func() { b.Close() })
	return b
}

// echo serves a TCP echo server on addr inside the namespace.
func (w *weirProc) echo(addr string) {
	w.t.Helper()
	ln := w.ns.Listen(w.t, addr)
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			go func() {
				defer c.Close()
				io.Copy(c, c)
			}()
		}
	}()
	w.t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	})
}

// load runs a bench.Load through the namespace.
func (w *weirProc) load(addr string, clients, requests int) bench.Result {
	return bench.Load{Dial: w.ns.Dial, Addr: addr, Clients: clients, Requests: requests, Duration: 30 * time.Second}.Run(context.Background())
}

// service and target find a service and target in a status.
func statusService(st api.Status, name string) *api.Service {
	for i := range st.Services {
		if st.Services[i].Name == name {
			return &st.Services[i]
		}
	}
	return nil
}

func pickedSum(st api.Status, service string) (sum uint64, by map[string]uint64) {
	by = map[string]uint64{}
	if s := statusService(st, service); s != nil {
		for _, tg := range s.Targets {
			sum += tg.Picked
			by[tg.Name] = tg.Picked
		}
	}
	return sum, by
}

func statusLevel(st api.Status, level, name string) *api.Level {
	for i := range st.Levels {
		if st.Levels[i].Level == level && st.Levels[i].Name == name {
			return &st.Levels[i]
		}
	}
	return nil
}

func refusalCount(st api.Status, level, limit string) uint64 {
	for _, r := range st.Refusals {
		if r.Level == level && r.Limit == limit {
			return r.Count
		}
	}
	return 0
}

// echoOnce dials addr from the namespace, sends a line and reads it back.
func (w *weirProc) echoOnce(addr string) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	c, err := w.ns.Dial(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	c.SetDeadline(time.Now().Add(3 * time.Second))
	msg := "hello weir\n"
	if _, err := io.WriteString(c, msg); err != nil {
		c.Close()
		return nil, err
	}
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(c, buf); err != nil {
		c.Close()
		return nil, err
	}
	if string(buf) != msg {
		c.Close()
		return nil, fmt.Errorf("echo %q, want %q", buf, msg)
	}
	c.SetDeadline(time.Time{})
	return c, nil
}
