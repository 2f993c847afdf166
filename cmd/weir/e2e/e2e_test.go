//go:build linux

package e2e

// End-to-end tests of the real `weir run` binary: every test creates its own
// network namespace (unnamed: it goes with the test, even a killed one),
// starts the built binary inside it (weirproc.Start), serves real HTTP/TCP backends on 198.18.1.x on the
// namespace's loopback, and drives kernel TCP clients through the VIPs
// (198.18.0.x, fd00::x) that weir routes through its TUN. They need root
// and /dev/net/tun, and skip with a message otherwise.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"go.uber.org/goleak"

	"weir/bench"
	"weir/cmd/weir/api"
	"weir/internal/netns"
	"weir/internal/testutil"
	"weir/internal/testutil/weirproc"
)

// e2eBackendAddrs are put on each namespace's loopback for the backends.
var e2eBackendAddrs = []string{"198.18.1.1", "198.18.1.2", "198.18.1.3"}

var (
	weirBinOnce sync.Once
	weirBinDir  string
	weirBinPath string
	weirBinErr  error
)

// TestMain removes the binary the e2e tests built and fails the package if
// a test left a goroutine running (in-process commands such as weir demo
// and weir check, the e2e helpers' loads, captures and waits).
func TestMain(m *testing.M) {
	testutil.VerifyNoLeaks(m, goleak.Cleanup(func(code int) {
		if weirBinDir != "" {
			os.RemoveAll(weirBinDir)
		}
		os.Exit(code)
	}))
}

// requireE2E skips the test in -short mode (make test's unit tier) and
// unless it can create namespaces and TUN devices.
func requireE2E(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("skipping: an end-to-end test of the built binary (make e2e runs them, as root; -short is the unit tier)")
	}
	if os.Geteuid() != 0 {
		t.Skip("skipping: the end-to-end tests run `weir run` in network namespaces and need root (CAP_NET_ADMIN)")
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		t.Skipf("skipping: end-to-end tests need /dev/net/tun: %v", err)
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
		out, err := exec.Command("go", "build", "-o", weirBinPath, "weir/cmd/weir").CombinedOutput()
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

// newNetNS creates a namespace (testutil.NetNS) with the backend addresses
// on its loopback; it goes when the test ends.
func newNetNS(t *testing.T) *netns.NS {
	t.Helper()
	ns := testutil.NetNS(t)
	if err := ns.Do(func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		for _, a := range e2eBackendAddrs {
			if err := netlink.AddrAdd(lo, &netlink.Addr{IPNet: netlink.NewIPNet(net.ParseIP(a))}); err != nil {
				return fmt.Errorf("address %s on lo: %w", a, err)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return ns
}

// weirProc is a `weir run` inside a namespace of its own.
type weirProc struct {
	*weirproc.Proc
	t       *testing.T
	ns      *netns.NS
	cfgPath string
}

// startWeir creates a namespace and starts weir in it on the config in
// testdata/e2e/<cfgName>, with extra flags (weirproc.Start); it returns
// once weir is ready. Cleanup kills weir (if still running) before the
// namespace goes, and prints weir's log when the test failed.
func startWeir(t *testing.T, cfgName string, extra ...string) *weirProc {
	t.Helper()
	requireE2E(t)
	bin := weirBinary(t)
	ns := newNetNS(t)
	w := &weirProc{t: t, ns: ns, cfgPath: filepath.Join(t.TempDir(), "weir.yaml")}
	w.writeConfig(cfgName)
	w.Proc = weirproc.Start(t, weirproc.Options{
		Binary: bin, Config: w.cfgPath, NS: ns, Extra: extra,
		TUNAddrs: []string{"198.18.0.1/32", "fd00::1/128"},
		Ready:    20 * time.Second,
	})
	return w
}

// listen listens inside the namespace; the listener closes when the test
// ends.
func (w *weirProc) listen(addr string) net.Listener {
	w.t.Helper()
	ln, err := w.ns.Listen("tcp", addr)
	if err != nil {
		w.t.Fatal(err)
	}
	w.t.Cleanup(func() { ln.Close() })
	return ln
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
	if err := w.Signal(s); err != nil {
		w.t.Fatalf("signal %v: %v", s, err)
	}
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
	sc := bufio.NewScanner(strings.NewReader(w.Log()))
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
	var found logLine
	ok := testutil.WithinEvery(d, 50*time.Millisecond, func() bool {
	lines:
		for _, l := range w.logLines() {
			msg, _ := l.m["message"].(string)
			for _, p := range parts {
				if !strings.Contains(msg, p) {
					continue lines
				}
			}
			found = l
			return true
		}
		return false
	})
	return found, ok
}

// status fetches /status.
func (w *weirProc) status() api.Status {
	w.t.Helper()
	var st api.Status
	if err := w.GetJSON("/status", &st); err != nil {
		w.t.Fatal(err)
	}
	return st
}

// waitStatus polls /status until ok holds, for up to d.
func (w *weirProc) waitStatus(d time.Duration, what string, ok func(api.Status) bool) api.Status {
	w.t.Helper()
	var st api.Status
	if !testutil.WithinEvery(d, 25*time.Millisecond, func() bool { st = w.status(); return ok(st) }) {
		w.t.Fatalf("after %v: not %s: %+v", d, what, st)
	}
	return st
}

// backend serves a bench.Backend named name on addr inside the namespace.
func (w *weirProc) backend(name, addr string, delay time.Duration) *bench.Backend {
	w.t.Helper()
	return w.heldBackend(name, addr, delay, nil)
}

// heldBackend is backend whose requests also wait for hold to close
// (bench.Backend.Hold).
func (w *weirProc) heldBackend(name, addr string, delay time.Duration, hold <-chan struct{}) *bench.Backend {
	w.t.Helper()
	b := &bench.Backend{Name: name, Delay: delay, Hold: hold}
	ln := w.listen(addr)
	go b.Serve(ln)
	w.t.Cleanup(func() { b.Close() })
	return b
}

// echo serves a TCP echo server on addr inside the namespace.
func (w *weirProc) echo(addr string) {
	w.t.Helper()
	ln := w.listen(addr)
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

// heldLoad runs load while the backends hold their requests (hold, see
// heldBackend) and closes hold once until holds (the refusals expected are
// counted, the requests expected are in progress), or after 20 s: the
// connections served stay open however slowly a loaded machine brings all
// clients in. It fails the test if until never held.
func (w *weirProc) heldLoad(hold chan struct{}, addr string, clients, requests int, until func() bool) bench.Result {
	w.t.Helper()
	done := make(chan bench.Result, 1)
	go func() { done <- w.load(addr, clients, requests) }()
	ok := testutil.WithinEvery(20*time.Second, 25*time.Millisecond, until)
	close(hold)
	res := <-done
	if !ok {
		w.t.Fatalf("%s: what the test waits for did not happen while the backends held their requests: %+v", addr, res)
	}
	return res
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
