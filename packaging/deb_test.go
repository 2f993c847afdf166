package packaging

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"debug/elf"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"weir/internal/testutil"
)

// TestWeirBinaryIsLean: the packaging tools (nfpm, cobra's man page
// generator and its Markdown renderer) are in go.mod for mkdeb and the
// weirdocs build only; the weir binary links none of them.
func TestWeirBinaryIsLean(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "weir/cmd/weir").Output()
	if err != nil {
		t.Fatalf("go list -deps weir/cmd/weir: %v", err)
	}
	for _, dep := range strings.Fields(string(out)) {
		for _, bad := range []string{"github.com/goreleaser/", "github.com/spf13/cobra/doc", "github.com/cpuguy83/go-md2man", "github.com/russross/blackfriday"} {
			if strings.HasPrefix(dep, bad) {
				t.Errorf("weir/cmd/weir depends on %s: packaging code leaked into the binary", dep)
			}
		}
	}
}

// builtDeb is the package TestDeb built, for the tests after it.
type builtDeb struct {
	path, version, arch string
	root                string // the throwaway root it is installed into
}

// TestDeb builds the package as `make deb` does, inspects it with dpkg-deb,
// installs it into a throwaway root with dpkg (maintainer scripts included),
// checks what landed there and verifies the unit with systemd-analyze.
func TestDeb(t *testing.T) {
	d := buildAndInstall(t)

	// The installed binary is static, carries the package's version and
	// accepts the example config.
	bin := filepath.Join(d.root, "usr/bin/weir")
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Errorf("%s has an ELF interpreter: not a static binary", bin)
		}
	}
	f.Close()
	if out := run(t, bin, "version"); strings.TrimSpace(out) != "weir "+d.version {
		t.Errorf("weir version = %q, want %q", out, "weir "+d.version)
	}
	run(t, bin, "check", "-c", filepath.Join(d.root, "etc/weir/example.yaml"))

	// postinst made the system user through systemd-sysusers --root.
	passwd, err := os.ReadFile(filepath.Join(d.root, "etc/passwd"))
	if err != nil {
		t.Fatalf("postinst made no user: %v", err)
	}
	if !regexp.MustCompile(`(?m)^weir:x:[0-9]+:[0-9]+:[^:]*:/nonexistent:/usr/sbin/nologin$`).Match(passwd) {
		t.Errorf("no system user weir in the root's /etc/passwd:\n%s", passwd)
	}
	if out := run(t, "dpkg", "--root="+d.root, "-s", "weir"); !strings.Contains(out, "Status: install ok installed") {
		t.Errorf("dpkg -s weir:\n%s", out)
	}

	// The man pages are gzipped roff, one per command.
	for _, page := range []string{"weir.1.gz", "weir-run.1.gz", "weir-check.1.gz", "weir-status.1.gz"} {
		roff := gunzip(t, filepath.Join(d.root, "usr/share/man/man1", page))
		if !strings.HasPrefix(roff, ".nh\n.TH \"WEIR\" \"1\"") || !strings.Contains(roff, d.version) {
			t.Errorf("%s is not weir's man page of version %s:\n%.200s", page, d.version, roff)
		}
	}
	if b, err := os.ReadFile(filepath.Join(d.root, "usr/share/bash-completion/completions/weir")); err != nil || !bytes.Contains(b, []byte("__start_weir")) {
		t.Errorf("bash completion: %v %.100s", err, b)
	}

	verifyUnit(t, d)

	// Removal and purge run the other scripts; the config goes only with
	// the purge, the user stays.
	dpkg(t, d.root, "-r", "weir")
	if _, err := os.Stat(filepath.Join(d.root, "usr/bin/weir")); !os.IsNotExist(err) {
		t.Errorf("weir removed, /usr/bin/weir still there: %v", err)
	}
	if _, err := os.Stat(filepath.Join(d.root, "etc/weir/example.yaml")); err != nil {
		t.Errorf("a removal (not a purge) must keep the conffile: %v", err)
	}
	dpkg(t, d.root, "--purge", "weir")
	if _, err := os.Stat(filepath.Join(d.root, "etc/weir/example.yaml")); !os.IsNotExist(err) {
		t.Errorf("weir purged, example.yaml still there: %v", err)
	}
}

// verifyUnit runs systemd-analyze verify on weir@example.service in the
// root: every warning is an error here. It also logs the exposure score of
// systemd-analyze security and fails if the hardening regresses past it.
func verifyUnit(t *testing.T, d *builtDeb) {
	t.Helper()
	if _, err := exec.LookPath("systemd-analyze"); err != nil {
		t.Log("skipping systemd-analyze verify: no systemd-analyze (apt-get install systemd)")
		return
	}
	// The unit's default dependencies (sysinit.target, …), its After= and
	// WantedBy= targets and ExecReload's kill live in the host's systemd and
	// procps, which the throwaway root does not have: copy them in.
	units, _ := filepath.Glob("/usr/lib/systemd/system/*.target")
	if len(units) == 0 {
		t.Log("skipping systemd-analyze verify: the host has no /usr/lib/systemd/system/*.target")
		return
	}
	for _, u := range units {
		copyFile(t, u, filepath.Join(d.root, "usr/lib/systemd/system", filepath.Base(u)))
	}
	copyFile(t, "/usr/bin/kill", filepath.Join(d.root, "usr/bin/kill"))

	// --man=no: man(1) would look on the host, not in the root; the page
	// Documentation= names is checked as a file instead.
	if _, err := os.Stat(filepath.Join(d.root, "usr/share/man/man1/weir-run.1.gz")); err != nil {
		t.Errorf("Documentation=man:weir-run(1): %v", err)
	}
	cmd := exec.Command("systemd-analyze", "verify", "--man=no", "--root="+d.root, "weir@example.service")
	if out, err := cmd.CombinedOutput(); err != nil || len(out) > 0 {
		t.Errorf("systemd-analyze verify weir@example.service: %v\n%s", err, out)
	}

	out, _ := exec.Command("systemd-analyze", "security", "--offline=yes", "--no-pager", "--root="+d.root, "weir@example.service").CombinedOutput()
	m := regexp.MustCompile(`Overall exposure level for weir@example.service: ([0-9.]+)`).FindSubmatch(out)
	if m == nil {
		t.Logf("systemd-analyze security gave no score (systemd older than 250?):\n%s", out)
		return
	}
	score, _ := strconv.ParseFloat(string(m[1]), 64)
	t.Logf("systemd-analyze security: exposure %.1f (0 = fully locked down, 10 = unprotected)", score)
	// 1.9 with systemd 252 (the rest is inherent: host network, netlink,
	// CAP_NET_ADMIN, CAP_NET_RAW and a packet socket for the host capture,
	// the TUN device).
	if score > 2.2 {
		t.Errorf("exposure %.1f > 2.2: a hardening line of weir@.service was lost\n%s", score, out)
	}
}

// TestUnitPrivilegeModel runs the installed weir the way weir@.service
// does — as an unprivileged user holding CAP_NET_ADMIN and CAP_NET_RAW (for
// the host capture, which weir opens and then drops it), as ambient
// capabilities, with no_new_privs and the unit's ExecStart line — in a network
// namespace of its own, and checks that it creates its TUN, routes the VIPs
// through it, reloads on SIGHUP (what ExecReload sends) and stops cleanly on
// SIGTERM. systemd itself cannot run here; setpriv sets up the same
// credentials.
func TestUnitPrivilegeModel(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("skipping: needs root to set up the unit's credentials and a network namespace")
	}
	for _, tool := range []string{"setpriv", "unshare", "ip"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("skipping: no %s (util-linux, iproute2)", tool)
		}
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		t.Skipf("skipping: no /dev/net/tun: %v", err)
	}
	d := buildAndInstall(t)

	// ExecStart, User= and AmbientCapabilities= as the unit says them.
	unit, err := os.ReadFile(filepath.Join(d.root, "usr/lib/systemd/system/weir@.service"))
	if err != nil {
		t.Fatal(err)
	}
	key := func(k string) string {
		m := regexp.MustCompile(`(?m)^` + k + `=(.*)$`).FindSubmatch(unit)
		if m == nil {
			t.Fatalf("weir@.service has no %s=", k)
		}
		return string(m[1])
	}
	if got := key("User"); got != "weir" {
		t.Fatalf("User=%s, want weir", got)
	}
	if got := key("AmbientCapabilities"); got != "CAP_NET_ADMIN CAP_NET_RAW" {
		t.Fatalf("AmbientCapabilities=%s, want CAP_NET_ADMIN CAP_NET_RAW", got)
	}
	uid := lookupUID(t, d.root, "weir")
	argv := strings.Fields(strings.ReplaceAll(key("ExecStart"), "%i", "example"))
	argv = argv[:len(argv)-1] // $WEIR_OPTS, empty without /etc/weir/example.env
	for i, a := range argv {
		if strings.HasPrefix(a, "/") {
			argv[i] = filepath.Join(d.root, a)
		}
	}
	// The user weir must be able to reach the files and write the ready
	// file: t.TempDir's directories are 0700.
	readyDir := t.TempDir()
	for dir, mode := range map[string]os.FileMode{d.root: 0o755, filepath.Dir(d.root): 0o755, readyDir: 0o777, filepath.Dir(readyDir): 0o755} {
		if err := os.Chmod(dir, mode); err != nil {
			t.Fatal(err)
		}
	}
	ready := filepath.Join(readyDir, "ready")
	argv = append(argv, "--ready-file", ready)

	priv := []string{"setpriv", "--reuid=" + uid, "--regid=" + uid, "--clear-groups",
		"--inh-caps=-all,+net_admin,+net_raw", "--ambient-caps=-all,+net_admin,+net_raw", "--bounding-set=-all,+net_admin,+net_raw", "--no-new-privs"}
	script := `ip link set lo up && exec "$@"`
	cmd := exec.Command("unshare", append([]string{"-n", "sh", "-c", script, "sh"}, append(priv, argv...)...)...)
	var logs testutil.SyncBuffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	defer func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			<-done
		}
	}()
	if !testutil.Within(10*time.Second, func() bool { _, err := os.Stat(ready); return err == nil }) {
		t.Fatalf("weir never got ready as the unit's user:\n%s", logs.String())
	}

	// The ready file is created before the drop; the log says when it is
	// done. (The log reaches the buffer through a pipe.)
	testutil.Within(5*time.Second, func() bool { return strings.Contains(logs.String(), `"weir running"`) })
	pid := strconv.Itoa(cmd.Process.Pid)
	status, _ := os.ReadFile("/proc/" + pid + "/status")
	// CAP_NET_RAW is gone once the host capture is open: only CAP_NET_ADMIN
	// (bit 12) is effective and permitted; without CAP_SETPCAP the bounding
	// set keeps the unit's two, which no_new_privs makes moot.
	for _, want := range []string{"Uid:\t" + uid + "\t", "CapEff:\t0000000000001000", "CapPrm:\t0000000000001000",
		"CapAmb:\t0000000000001000", "CapBnd:\t0000000000003000", "NoNewPrivs:\t1"} {
		if !strings.Contains(string(status), want) {
			t.Errorf("weir's /proc status has no %q:\n%s", want, status)
		}
	}
	routes := run(t, "nsenter", "--net=/proc/"+pid+"/ns/net", "ip", "route", "show", "dev", "weir0")
	if !strings.Contains(routes, "198.18.0.10") {
		t.Errorf("VIP 198.18.0.10 not routed through weir0 by the unprivileged weir: %q\n%s", routes, logs.String())
	}
	// weir has nothing left to drop and must not claim otherwise. (The log
	// reaches the buffer through a pipe, a little after the ready file.)
	testutil.Within(5*time.Second, func() bool { return strings.Contains(logs.String(), `"weir running"`) })
	if l := logs.String(); strings.Contains(l, "not dropped") || !strings.Contains(l, `"privileges dropped"`) {
		t.Errorf("weir's privilege drop under the unit's credentials:\n%s", l)
	}
	// The via: host legs are measured: the capture opened with the unit's
	// CAP_NET_RAW before the drop.
	if l := logs.String(); strings.Contains(l, "host capture: cannot be opened") {
		t.Errorf("the host capture did not open under the unit's credentials:\n%s", l)
	}
	cmd.Process.Signal(syscall.SIGHUP)
	if !testutil.Within(10*time.Second, func() bool { return strings.Contains(logs.String(), "configuration reloaded") }) {
		t.Errorf("no reload after SIGHUP:\n%s", logs.String())
	}
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("weir after SIGTERM: %v\n%s", err, logs.String())
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("weir did not stop on SIGTERM:\n%s", logs.String())
	}
}

// buildAndInstall builds the package into a temporary directory and
// installs it into a throwaway root, checking the package on the way.
// Tests skip where the Debian tools are missing.
func buildAndInstall(t *testing.T) *builtDeb {
	t.Helper()
	if testing.Short() {
		t.Skip("skipping under -short: builds weir twice and a package")
	}
	for _, tool := range []string{"dpkg-deb", "dpkg", "git", "systemd-sysusers"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("skipping: no %s on this machine (apt-get install dpkg git systemd)", tool)
		}
	}
	d := &builtDeb{path: buildOnce(t)}
	m := regexp.MustCompile(`^weir_([0-9][A-Za-z0-9.+~]*)_([a-z0-9]+)\.deb$`).FindStringSubmatch(filepath.Base(d.path))
	if m == nil {
		t.Fatalf("package file %q is not weir_<version>_<arch>.deb", d.path)
	}
	d.version, d.arch = m[1], m[2]
	if want := strings.TrimSpace(run(t, "dpkg", "--print-architecture")); d.arch != want {
		t.Errorf("package architecture %s, this machine's is %s", d.arch, want)
	}

	// Control fields and maintainer scripts.
	info := run(t, "dpkg-deb", "--info", d.path)
	for _, want := range []string{"Package: weir\n", "Version: " + d.version + "\n", "Architecture: " + d.arch + "\n",
		"Section: net\n", " postinst ", " prerm ", " postrm ", " conffiles "} {
		if !strings.Contains(info, want) {
			t.Errorf("dpkg-deb --info has no %q:\n%s", want, info)
		}
	}
	if c := run(t, "dpkg-deb", "-I", d.path, "conffiles"); strings.TrimSpace(c) != "/etc/weir/example.yaml" {
		t.Errorf("conffiles = %q, want /etc/weir/example.yaml", c)
	}

	// Every file with its mode and owner.
	want := map[string]string{
		"./usr/bin/weir":                                     "-rwxr-xr-x",
		"./usr/lib/systemd/system/weir@.service":             "-rw-r--r--",
		"./usr/lib/sysusers.d/weir.conf":                     "-rw-r--r--",
		"./usr/lib/modules-load.d/weir.conf":                 "-rw-r--r--",
		"./etc/weir/":                                        "drwxr-xr-x",
		"./etc/weir/example.yaml":                            "-rw-r--r--",
		"./usr/share/man/man1/weir.1.gz":                     "-rw-r--r--",
		"./usr/share/man/man1/weir-run.1.gz":                 "-rw-r--r--",
		"./usr/share/bash-completion/completions/weir":       "-rw-r--r--",
		"./usr/share/zsh/vendor-completions/_weir":           "-rw-r--r--",
		"./usr/share/fish/vendor_completions.d/weir.fish":    "-rw-r--r--",
		"./usr/share/doc/weir/README.md":                     "-rw-r--r--",
		"./usr/share/doc/weir/SECURITY.md":                   "-rw-r--r--",
		"./usr/share/doc/weir/docs/configuration.md":         "-rw-r--r--",
		"./usr/share/doc/weir/docs/operations.md":            "-rw-r--r--",
		"./usr/share/doc/weir/docs/bench/2026-12-01-1217.md": "-rw-r--r--",
	}
	sc := bufio.NewScanner(strings.NewReader(run(t, "dpkg-deb", "--contents", d.path)))
	for sc.Scan() {
		// drwxr-xr-x root/root         0 2026-12-01 09:18 ./etc/weir/
		fs := strings.Fields(sc.Text())
		if len(fs) < 6 {
			continue
		}
		path := fs[5]
		if fs[1] != "root/root" {
			t.Errorf("%s is owned by %s, want root/root", path, fs[1])
		}
		if mode, ok := want[path]; ok {
			if fs[0] != mode {
				t.Errorf("%s has mode %s, want %s", path, fs[0], mode)
			}
			delete(want, path)
		}
	}
	for path := range want {
		t.Errorf("the package has no %s", path)
	}

	// A throwaway root: dpkg's database, merged /usr like Debian's, and
	// the maintainer scripts run outside it (chrootless) with DPKG_ROOT set,
	// so that the root needs no shell of its own.
	d.root = t.TempDir()
	for _, dir := range []string{"var/lib/dpkg/info", "var/lib/dpkg/updates", "var/lib/dpkg/triggers", "usr/bin", "usr/lib/systemd/system"} {
		if err := os.MkdirAll(filepath.Join(d.root, dir), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"var/lib/dpkg/status", "var/lib/dpkg/available"} {
		if err := os.WriteFile(filepath.Join(d.root, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, l := range []string{"bin", "lib"} {
		if err := os.Symlink("usr/"+l, filepath.Join(d.root, l)); err != nil {
			t.Fatal(err)
		}
	}
	dpkg(t, d.root, "-i", d.path)
	return d
}

var built struct {
	once      sync.Once
	dir, path string
	err       error
}

// buildOnce builds the package as `make deb` does, once for all the tests
// (TestMain removes it).
func buildOnce(t *testing.T) string {
	t.Helper()
	built.once.Do(func() {
		if built.dir, built.err = os.MkdirTemp("", "weir-deb-test-"); built.err != nil {
			return
		}
		cmd := exec.Command("go", "run", "./cmd/mkdeb", "-o", built.dir)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			built.err = fmt.Errorf("go run ./cmd/mkdeb: %v\n%s", err, stderr.Bytes())
		}
		built.path = strings.TrimSpace(string(out))
	})
	if built.err != nil {
		t.Fatal(built.err)
	}
	return built.path
}

func TestMain(m *testing.M) {
	code := m.Run()
	if built.dir != "" {
		os.RemoveAll(built.dir)
	}
	os.Exit(code)
}

// dpkg runs dpkg on the throwaway root.
func dpkg(t *testing.T, root string, args ...string) string {
	t.Helper()
	return run(t, "dpkg", append([]string{"--root=" + root, "--force-script-chrootless", "--force-not-root",
		"--force-bad-path", "--log=/dev/null"}, args...)...)
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s%s", name, strings.Join(args, " "), err, out, stderr.Bytes())
	}
	return string(out)
}

func gunzip(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	b, err := io.ReadAll(zr)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return string(b)
}

func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Stat(src)
	if err := os.WriteFile(dst, b, fi.Mode().Perm()); err != nil {
		t.Fatal(err)
	}
}

// lookupUID is name's uid in root's /etc/passwd.
func lookupUID(t *testing.T, root, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "etc/passwd"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if fs := strings.Split(line, ":"); len(fs) > 2 && fs[0] == name {
			return fs[2]
		}
	}
	t.Fatalf("no user %s in %s/etc/passwd", name, root)
	return ""
}
