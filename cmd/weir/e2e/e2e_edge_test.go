//go:build linux

package e2e

// End-to-end tests of weir run's edges: least privilege (--user), the
// front-NIC capture (--capture), and the reload of a file weir can no longer
// read. Root, /dev/net/tun and ip(8) needed; run under the netns lock.

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/google/gopacket/pcapgo"

	"weir/cmd/weir/api"
	"weir/internal/testutil/weirproc"
)

var (
	staticBinOnce sync.Once
	staticBinPath string
	staticBinErr  error
)

// staticWeir builds weir as `make build` does (CGO_ENABLED=0): --user
// changes the credentials of every thread at once, which Go only does
// without cgo.
func staticWeir(t *testing.T) string {
	t.Helper()
	staticBinOnce.Do(func() {
		dir, err := os.MkdirTemp("", "weir-e2e-static-")
		if err != nil {
			staticBinErr = err
			return
		}
		// The dropped user runs it: the folder must be searchable.
		os.Chmod(dir, 0o755)
		staticBinPath = filepath.Join(dir, "weir")
		cmd := exec.Command("go", "build", "-o", staticBinPath, "weir/cmd/weir")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			staticBinErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if staticBinErr != nil {
		t.Fatal(staticBinErr)
	}
	return staticBinPath
}

// startWeirText starts bin in a new namespace on the config text, in a
// folder any user may read (weir may run as another user by the time it
// reloads), with extra flags; it returns once weir is ready.
func startWeirText(t *testing.T, bin, text string, extra ...string) *weirProc {
	t.Helper()
	ns := newNetNS(t)
	// Not t.TempDir: its parent is private to root.
	dir, err := os.MkdirTemp("", "weir-e2e-edge-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	w := &weirProc{t: t, ns: ns, cfgPath: filepath.Join(dir, "weir.yaml")}
	if err := os.WriteFile(w.cfgPath, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	w.Proc = weirproc.Start(t, weirproc.Options{Binary: bin, Config: w.cfgPath, NS: ns, Extra: extra, Ready: 20 * time.Second})
	return w
}

// pid finds weir's process: the one whose command line names its config.
func (w *weirProc) pid() int {
	w.t.Helper()
	cmdlines, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, c := range cmdlines {
		b, err := os.ReadFile(c)
		if err != nil || !bytes.Contains(b, []byte("\x00-c\x00"+w.cfgPath+"\x00")) {
			continue
		}
		if pid, err := strconv.Atoi(filepath.Base(filepath.Dir(c))); err == nil {
			return pid
		}
	}
	w.t.Fatalf("no process runs weir on %s", w.cfgPath)
	return 0
}

const edgeYAML = `services:
  - name: web
    vips: [198.18.0.10]
    port: 80
    protocol: http
    targets:
      - {name: t1, address: "198.18.1.1:8081"}
`

const edgeYAMLMore = edgeYAML + `  - name: more
    vips: [198.18.0.11]
    port: 80
    protocol: http
    targets:
      - {name: t1, address: "198.18.1.1:8081"}
`

// procStatus returns the fields of /proc/PID[/task/TID]/status.
func procStatus(t *testing.T, path string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok {
			m[k] = strings.Join(strings.Fields(v), " ")
		}
	}
	return m
}

// TestE2EUserDropsPrivileges is issue 13's least-privilege probe: weir run
// --user nobody becomes nobody on every thread with CAP_NET_ADMIN alone,
// still serves, still reloads (the new VIP is routed: route sync needs
// CAP_NET_ADMIN) and can no longer read a file only root can.
func TestE2EUserDropsPrivileges(t *testing.T) {
	requireE2E(t)
	nobody, err := user.Lookup("nobody")
	if err != nil {
		t.Skipf("skipping: no user nobody: %v", err)
	}
	bin := staticWeir(t)
	w := startWeirText(t, bin, edgeYAML, "--user", "nobody")
	w.backend("t1", "198.18.1.1:8081", 0)

	// Every thread: nobody's uids and gids, no supplementary root group,
	// only CAP_NET_ADMIN (bit 12) in every set, no_new_privs.
	const netAdmin = "0000000000001000"
	want := map[string]string{
		"Uid": strings.Repeat(nobody.Uid+" ", 3) + nobody.Uid, "Gid": strings.Repeat(nobody.Gid+" ", 3) + nobody.Gid,
		"CapInh": netAdmin, "CapPrm": netAdmin, "CapEff": netAdmin, "CapBnd": netAdmin, "CapAmb": netAdmin,
		"NoNewPrivs": "1",
	}
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", w.pid()))
	if err != nil || len(tasks) < 2 {
		t.Fatalf("threads of weir: %v %v", tasks, err)
	}
	for _, task := range tasks {
		st := procStatus(t, task)
		for k, v := range want {
			if st[k] != v {
				t.Errorf("%s: %s %q, want %q", task, k, st[k], v)
			}
		}
		if strings.Contains(" "+st["Groups"]+" ", " 0 ") {
			t.Errorf("%s: still in group 0: Groups %q", task, st["Groups"])
		}
	}

	if res := w.load("198.18.0.10:80", 2, 20); res.OK != 20 {
		t.Fatalf("dropped weir served %d of 20: %+v", res.OK, res)
	}
	// A reload adds a VIP: its route through the TUN needs CAP_NET_ADMIN.
	if err := os.WriteFile(w.cfgPath, []byte(edgeYAMLMore), 0o644); err != nil {
		t.Fatal(err)
	}
	w.signal(syscall.SIGHUP)
	w.waitStatus(5*time.Second, "reloaded", func(st api.Status) bool { return st.Generation == 2 })
	if st := w.status(); st.ReloadError != nil {
		t.Fatalf("reload as nobody failed: %+v", st.ReloadError)
	}
	if res := w.load("198.18.0.11:80", 1, 10); res.OK != 10 {
		t.Fatalf("the VIP added by the reload served %d of 10: %+v", res.OK, res)
	}
	// A file only root can read: the dropped weir cannot open it.
	if err := os.Chmod(w.cfgPath, 0o600); err != nil {
		t.Fatal(err)
	}
	w.signal(syscall.SIGHUP)
	st := w.waitStatus(5*time.Second, "showing the reload error", func(st api.Status) bool { return st.ReloadError != nil })
	if !strings.Contains(st.ReloadError.Err, "permission denied") || st.Generation != 2 {
		t.Errorf("reload of a root-only file: generation %d, error %+v; want permission denied", st.Generation, st.ReloadError)
	}
	if res := w.load("198.18.0.10:80", 1, 5); res.OK != 5 {
		t.Errorf("after the refused reload: %d of 5 OK", res.OK)
	}
	w.signal(syscall.SIGTERM)
	if code, err := w.Wait(10 * time.Second); code != 0 || err != nil {
		t.Errorf("exit %d, %v after SIGTERM", code, err)
	}
}

// TestE2ECapture: --capture records what the front NIC sees, both
// directions, in a pcap file tcpdump and gopacket read; --capture-max
// bounds it.
func TestE2ECapture(t *testing.T) {
	requireE2E(t)
	bin := staticWeir(t)
	for _, tt := range []struct {
		name    string
		max     string
		bounded bool
	}{
		{"whole", "", false},
		{"bounded", "4KiB", true},
	} {
		// No t.Run: the namespace helpers are per test; each case is short.
		capPath := filepath.Join(t.TempDir(), "front.pcap")
		extra := []string{"--capture", capPath}
		if tt.max != "" {
			extra = append(extra, "--capture-max", tt.max)
		}
		w := startWeirText(t, bin, edgeYAML, extra...)
		w.backend("t1", "198.18.1.1:8081", 0)
		// Without --user weir stays root but keeps CAP_NET_ADMIN alone.
		st := procStatus(t, fmt.Sprintf("/proc/%d/status", w.pid()))
		if st["Uid"] != "0 0 0 0" || st["CapEff"] != "0000000000001000" || st["CapBnd"] != "0000000000001000" {
			t.Errorf("%s: weir without --user: Uid %q CapEff %q CapBnd %q, want root with CAP_NET_ADMIN only", tt.name, st["Uid"], st["CapEff"], st["CapBnd"])
		}
		if res := w.load("198.18.0.10:80", 2, 30); res.OK != 30 {
			t.Fatalf("%s: %d of 30 OK with a capture: %+v", tt.name, res.OK, res)
		}
		w.signal(syscall.SIGTERM)
		if code, err := w.Wait(10 * time.Second); code != 0 || err != nil {
			t.Fatalf("%s: exit %d, %v", tt.name, code, err)
		}
		fi, err := os.Stat(capPath)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: capture mode %v, want 0600", tt.name, fi.Mode().Perm())
		}
		toVIP, fromVIP, n := readVIPCapture(t, capPath, "198.18.0.10")
		t.Logf("%s: capture of %d bytes: %d packets, %d to the VIP, %d from it", tt.name, fi.Size(), n, toVIP, fromVIP)
		if tt.bounded {
			if fi.Size() > 4<<10 || n == 0 {
				t.Errorf("%s: capture %d bytes, %d packets; want 1..4KiB", tt.name, fi.Size(), n)
			}
			if l, ok := w.waitLog(time.Second, "capture closed"); !ok || l.m["not_recorded"].(float64) == 0 {
				t.Errorf("%s: no capture summary counting the packets left out: %v", tt.name, l.raw)
			}
		} else if toVIP < 30*3 || fromVIP < 30*3 {
			// Each request: SYN, ACK, request, FIN… from the client and
			// SYN-ACK, response, FIN… from weir.
			t.Errorf("%s: %d packets to the VIP and %d from it for 30 requests", tt.name, toVIP, fromVIP)
		}
		if path, err := exec.LookPath("tcpdump"); err == nil {
			out, err := exec.Command(path, "-nr", capPath).CombinedOutput()
			if err != nil || !strings.Contains(string(out), "198.18.0.10.80") {
				t.Errorf("%s: tcpdump -r: %v\n%s", tt.name, err, out)
			}
		}
	}
}

// readVIPCapture counts the TCP packets of a RAW capture to and from vip.
func readVIPCapture(t *testing.T, path, vip string) (to, from, total int) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r, err := pcapgo.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	if r.LinkType() != layers.LinkTypeRaw {
		t.Fatalf("link type %v", r.LinkType())
	}
	for {
		data, _, err := r.ReadPacketData()
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			t.Fatalf("record %d: %v", total, err)
		}
		total++
		p := gopacket.NewPacket(data, layers.LinkTypeRaw, gopacket.Default)
		ip, _ := p.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
		if ip == nil || p.Layer(layers.LayerTypeTCP) == nil {
			continue
		}
		switch vip {
		case ip.DstIP.String():
			to++
		case ip.SrcIP.String():
			from++
		}
	}
}
