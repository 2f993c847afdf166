package vmtest

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// EnvInVM is the environment variable /init sets to "1" for the program it
// runs inside the VM; InVM reports it.
const EnvInVM = "WEIR_IN_VM"

// Console sentinels printed by /init, each at the start of its own line.
const (
	sentinelStart = "VMTEST-START"  // the binary is about to run
	sentinelExit  = "VMTEST-EXIT="  // followed by the binary's exit status
	sentinelError = "VMTEST-ERROR=" // followed by why /init gave up
)

// How to run the binary: its path inside the VM.
const vmBinary = "/test"

// InVM reports whether this process runs inside a VM booted by the harness.
// Scenario tests run their body when it is true and call RunTest otherwise.
func InVM() bool { return os.Getenv(EnvInVM) == "1" }

// Options describe one VM run. The zero value is not enough: Binary is
// required; every other field has a default.
type Options struct {
	// Binary is the host path of the static program to run inside the VM
	// (at /test) as the child of /init. Required.
	Binary string
	// Args are Binary's arguments.
	Args []string
	// Env are extra NAME=value variables for Binary; EnvInVM=1 and
	// TMPDIR=/tmp are always set.
	Env []string
	// Files are extra files to put into the VM: VM path → host path, e.g.
	// "/bin/weir" → "../bin/weir". Missing parent directories are created.
	Files map[string]string
	// Modules are kernel modules to load before Binary runs, by name
	// ("veth", "sch_netem"); their dependencies are loaded first and
	// modules built into the kernel are skipped.
	Modules []string
	// Kernel is the kernel image; "" means the newest /boot/vmlinuz-*.
	Kernel string
	// ModulesDir holds the kernel's modules.dep; "" means
	// /lib/modules/<version>, the version taken from Kernel's file name.
	ModulesDir string
	// Busybox is a static busybox, the VM's userland; "" means
	// /bin/busybox.
	Busybox string
	// QEMU is the emulator; "" means qemu-system-x86_64 from PATH.
	QEMU string
	// MemoryMiB is the VM's memory; 0 means 512.
	MemoryMiB int
	// CPUs is the number of virtual CPUs; 0 means 2.
	CPUs int
	// Timeout bounds the whole run, boot included; QEMU is killed when it
	// passes. 0 means 5 minutes.
	Timeout time.Duration
	// CacheDir keeps the base initramfs (busybox and modules) between runs;
	// "" means the cache folder beside this package's source.
	CacheDir string
	// Console receives the VM's serial console, line by line, without the
	// carriage returns; nil discards it.
	Console io.Writer
}

// Result is what a VM run produced.
type Result struct {
	// ExitCode is Binary's exit status as /init saw it.
	ExitCode int
	// Boot is the time from starting QEMU until Binary started.
	Boot time.Duration
	// Total is the time from starting QEMU until it exited.
	Total time.Duration
	// Accel is the QEMU accelerator used: "kvm" or "tcg".
	Accel string
}

// Available returns nil when this host can boot the VM, or an error saying
// what is missing and how to get it. It checks the emulator, a readable
// kernel image (Debian installs them readable only by root) and busybox.
func Available() error {
	var o Options
	return o.resolve()
}

// resolve fills in the defaults and checks that every host file exists.
func (o *Options) resolve() error {
	const hint = "install with `sudo scripts/vm-deps.sh` and run `sudo make vmtest`"
	if o.QEMU == "" {
		o.QEMU = "qemu-system-x86_64"
	}
	q, err := exec.LookPath(o.QEMU)
	if err != nil {
		return fmt.Errorf("vmtest: no %s (%v); %s", o.QEMU, err, hint)
	}
	o.QEMU = q
	if o.Kernel == "" {
		ks, _ := filepath.Glob("/boot/vmlinuz-*")
		if len(ks) == 0 {
			return fmt.Errorf("vmtest: no /boot/vmlinuz-* kernel; %s", hint)
		}
		sort.Slice(ks, func(i, j int) bool { return versionLess(ks[i], ks[j]) })
		o.Kernel = ks[len(ks)-1]
	}
	f, err := os.Open(o.Kernel)
	if err != nil {
		return fmt.Errorf("vmtest: kernel image not readable (%v); %s", err, hint)
	}
	f.Close()
	if o.ModulesDir == "" {
		_, ver, ok := strings.Cut(filepath.Base(o.Kernel), "vmlinuz-")
		if !ok {
			return fmt.Errorf("vmtest: cannot tell the version of kernel %s; set Options.ModulesDir", o.Kernel)
		}
		o.ModulesDir = filepath.Join("/lib/modules", ver)
	}
	if o.Busybox == "" {
		o.Busybox = "/bin/busybox"
	}
	if err := requireStatic(o.Busybox); err != nil {
		return fmt.Errorf("%w; %s", err, hint)
	}
	if o.MemoryMiB == 0 {
		o.MemoryMiB = 512
	}
	if o.CPUs == 0 {
		o.CPUs = 2
	}
	if o.Timeout == 0 {
		o.Timeout = 5 * time.Minute
	}
	if o.CacheDir == "" {
		o.CacheDir = defaultCacheDir()
	}
	if o.Console == nil {
		o.Console = io.Discard
	}
	return nil
}

// versionLess orders file names by their embedded numbers, so that
// vmlinuz-6.10 sorts after vmlinuz-6.9.
func versionLess(a, b string) bool {
	split := func(s string) []string {
		return strings.FieldsFunc(s, func(r rune) bool { return r == '.' || r == '-' || r == '_' })
	}
	as, bs := split(a), split(b)
	for i := 0; i < len(as) && i < len(bs); i++ {
		an, aerr := strconv.Atoi(as[i])
		bn, berr := strconv.Atoi(bs[i])
		switch {
		case aerr == nil && berr == nil && an != bn:
			return an < bn
		case (aerr != nil || berr != nil) && as[i] != bs[i]:
			return as[i] < bs[i]
		}
	}
	return len(as) < len(bs)
}

// defaultCacheDir is vmtest/cache in the source tree (gitignored), or the
// user cache folder when the source is not where it was compiled.
func defaultCacheDir() string {
	if _, file, _, ok := runtime.Caller(0); ok {
		dir := filepath.Join(filepath.Dir(file), "cache")
		if st, err := os.Stat(filepath.Dir(dir)); err == nil && st.IsDir() {
			return dir
		}
	}
	if d, err := os.UserCacheDir(); err == nil {
		return filepath.Join(d, "weir-vmtest")
	}
	return filepath.Join(os.TempDir(), "weir-vmtest")
}

// isStatic reports whether the ELF file at path needs no dynamic loader.
func isStatic(path string) (bool, error) {
	f, err := elf.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return false, nil
		}
	}
	return true, nil
}

// requireStatic fails unless path is a statically linked ELF: the VM has no
// shared libraries.
func requireStatic(path string) error {
	ok, err := isStatic(path)
	if err != nil {
		return fmt.Errorf("vmtest: %s: %w", path, err)
	}
	if !ok {
		return fmt.Errorf("vmtest: %s is dynamically linked; the VM has no shared libraries (build with CGO_ENABLED=0)", path)
	}
	return nil
}

// Run boots the VM, runs o.Binary in it and returns its exit status. An
// error means the run itself failed (no VM, no exit line, timeout); a
// binary that fails is a nil error and a non-zero Result.ExitCode.
func Run(ctx context.Context, o Options) (Result, error) {
	if err := o.resolve(); err != nil {
		return Result{}, err
	}
	if o.Binary == "" {
		return Result{}, errors.New("vmtest: Options.Binary is required")
	}
	if err := requireStatic(o.Binary); err != nil {
		return Result{}, err
	}
	mods, err := moduleOrder(o.ModulesDir, o.Modules)
	if err != nil {
		return Result{}, err
	}
	work, err := os.MkdirTemp("", "weir-vmtest-")
	if err != nil {
		return Result{}, err
	}
	defer os.RemoveAll(work)
	base, err := baseArchive(o, mods)
	if err != nil {
		// An unwritable cache (another user's checkout) only costs time.
		uncached := o
		uncached.CacheDir = work
		var err2 error
		if base, err2 = baseArchive(uncached, mods); err2 != nil {
			return Result{}, errors.Join(err, err2)
		}
	}
	initrd := filepath.Join(work, "initrd.cpio")
	if err := writeInitrd(initrd, base, o, mods); err != nil {
		return Result{}, err
	}

	// TCG (software emulation) by default: it boots everywhere, about 6 s
	// here. KVM only when asked for: some hosts offer a /dev/kvm whose
	// guests never get past the BIOS (nested virtualisation without the CPU
	// features the kernel wants), and a hang there costs the whole timeout.
	res := Result{Accel: "tcg"}
	switch a := os.Getenv(EnvAccel); a {
	case "", "tcg":
	case "kvm":
		res.Accel = a
	default:
		return Result{}, fmt.Errorf("vmtest: %s=%q: want kvm or tcg", EnvAccel, a)
	}
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, o.QEMU,
		"-kernel", o.Kernel,
		"-initrd", initrd,
		"-append", "console=ttyS0 quiet panic=-1 mitigations=off",
		"-accel", res.Accel,
		"-cpu", "max",
		"-m", strconv.Itoa(o.MemoryMiB),
		"-smp", strconv.Itoa(o.CPUs),
		"-nographic", "-no-reboot", "-nic", "none",
	)
	cmd.WaitDelay = 5 * time.Second
	// Should this process die first (a go test -timeout panic), take QEMU
	// with it rather than leave an emulator spinning.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return res, err
	}
	cmd.Stderr = cmd.Stdout // one stream: QEMU's own errors are console context
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return res, fmt.Errorf("vmtest: start %s: %w", o.QEMU, err)
	}
	exit, problem, tail := scanConsole(out, o.Console, start, &res)
	werr := cmd.Wait()
	res.Total = time.Since(start)
	switch {
	case ctx.Err() != nil:
		return res, fmt.Errorf("vmtest: VM killed after %v (timeout %v); console ends:\n%s", res.Total.Round(time.Millisecond), o.Timeout, tail)
	case problem != "":
		return res, fmt.Errorf("vmtest: /init: %s; console ends:\n%s", problem, tail)
	case exit < 0:
		return res, fmt.Errorf("vmtest: VM ended without an exit line (qemu: %v); console ends:\n%s", werr, tail)
	}
	res.ExitCode = exit
	return res, nil
}

// scanConsole copies the console to w line by line and picks out the
// sentinels. It returns the binary's exit status (-1 when none was
// printed), /init's error if any, and the console's last lines.
func scanConsole(r io.Reader, w io.Writer, start time.Time, res *Result) (exit int, problem, tail string) {
	const keep = 40
	var last []string
	exit = -1
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := stripEscapes(strings.TrimRight(sc.Text(), "\r"))
		fmt.Fprintln(w, line)
		if len(last) == keep {
			last = last[1:]
		}
		last = append(last, line)
		// A sentinel may follow other output on its line (the firmware
		// leaves no newline before the kernel's first words).
		s := line
		if i := strings.LastIndex(s, "VMTEST-"); i > 0 {
			s = s[i:]
		}
		switch {
		case s == sentinelStart && res.Boot == 0:
			res.Boot = time.Since(start)
		case strings.HasPrefix(s, sentinelExit):
			if n, err := strconv.Atoi(strings.TrimPrefix(s, sentinelExit)); err == nil {
				exit = n
			}
		case strings.HasPrefix(s, sentinelError):
			problem = strings.TrimPrefix(s, sentinelError)
		}
	}
	// Drain whatever follows a scanner error so QEMU never blocks.
	_, _ = io.Copy(io.Discard, r)
	return exit, problem, strings.Join(last, "\n")
}

// stripEscapes removes terminal control sequences (the firmware clears the
// screen) so that logs stay readable: ESC followed by one character, or a
// CSI sequence (ESC [ parameters, final byte).
func stripEscapes(s string) string {
	if !strings.Contains(s, "\x1b") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != 0x1b {
			b.WriteByte(s[i])
			continue
		}
		i++
		if i < len(s) && s[i] == '[' {
			for i++; i < len(s) && (s[i] < 0x40 || s[i] > 0x7e); i++ {
			}
		}
	}
	return b.String()
}

// module is one loadable kernel module file.
type module struct {
	name string // as insmod sees it: the file's base name
	path string // host path
}

// moduleOrder resolves names through modules.dep into the files to load,
// dependencies first, skipping modules listed in modules.builtin.
func moduleOrder(dir string, names []string) ([]module, error) {
	if len(names) == 0 {
		return nil, nil
	}
	canon := func(s string) string {
		s = filepath.Base(s)
		if i := strings.Index(s, ".ko"); i >= 0 {
			s = s[:i]
		}
		return strings.ReplaceAll(s, "-", "_")
	}
	builtin := map[string]bool{}
	if data, err := os.ReadFile(filepath.Join(dir, "modules.builtin")); err == nil {
		for _, l := range strings.Fields(string(data)) {
			builtin[canon(l)] = true
		}
	}
	data, err := os.ReadFile(filepath.Join(dir, "modules.dep"))
	if err != nil {
		return nil, fmt.Errorf("vmtest: kernel modules: %w", err)
	}
	paths := map[string]string{}
	deps := map[string][]string{}
	for _, l := range strings.Split(string(data), "\n") {
		file, rest, ok := strings.Cut(l, ":")
		if !ok {
			continue
		}
		n := canon(file)
		paths[n] = filepath.Join(dir, file)
		for _, d := range strings.Fields(rest) {
			deps[n] = append(deps[n], canon(d))
		}
	}
	var out []module
	seen := map[string]bool{}
	var visit func(n string) error
	visit = func(n string) error {
		if seen[n] || builtin[n] {
			return nil
		}
		seen[n] = true
		p, ok := paths[n]
		if !ok {
			return fmt.Errorf("vmtest: kernel module %s is neither in %s/modules.dep nor built in", n, dir)
		}
		// modules.dep lists the full closure; loading the list backwards
		// puts every module after what it needs, and visiting each
		// dependency first keeps that order for shared ones too.
		for i := len(deps[n]) - 1; i >= 0; i-- {
			if err := visit(deps[n][i]); err != nil {
				return err
			}
		}
		out = append(out, module{name: filepath.Base(p), path: p})
		return nil
	}
	for _, n := range names {
		if err := visit(canon(n)); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// baseDirs are the folders of the base archive, parents first.
var baseDirs = []string{"bin", "dev", "etc", "lib", "lib/modules", "proc", "sys", "tmp", "root"}

// baseArchive returns the path of the cached base archive for this busybox
// and module set, building it when missing. The cache key covers every
// input's path, size and mtime.
func baseArchive(o Options, mods []module) (string, error) {
	h := sha256.New()
	for _, p := range append([]string{o.Busybox}, modPaths(mods)...) {
		st, err := os.Stat(p)
		if err != nil {
			return "", fmt.Errorf("vmtest: %w", err)
		}
		fmt.Fprintf(h, "%s %d %d\n", p, st.Size(), st.ModTime().UnixNano())
	}
	path := filepath.Join(o.CacheDir, "base-"+hex.EncodeToString(h.Sum(nil))[:16]+".cpio")
	if f, err := os.Open(path); err == nil {
		f.Close()
		return path, nil
	}
	if err := os.MkdirAll(o.CacheDir, 0o755); err != nil {
		return "", fmt.Errorf("vmtest: cache: %w", err)
	}
	tmp, err := os.CreateTemp(o.CacheDir, "base-*.tmp")
	if err != nil {
		return "", fmt.Errorf("vmtest: cache: %w", err)
	}
	defer os.Remove(tmp.Name()) // after a successful rename this is a no-op
	c := newCpio(tmp)
	for _, d := range baseDirs {
		c.dir(d)
	}
	c.charDev("dev/console", 5, 1)
	c.charDev("dev/null", 1, 3)
	c.file("bin/busybox", o.Busybox)
	for _, m := range mods {
		c.file("lib/modules/"+m.name, m.path)
	}
	err = c.close()
	if err == nil {
		err = tmp.Chmod(0o644) // CreateTemp made it private; others may share the cache
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return "", fmt.Errorf("vmtest: cache: %w", err)
	}
	return path, nil
}

func modPaths(mods []module) []string {
	var ps []string
	for _, m := range mods {
		ps = append(ps, m.path)
	}
	return ps
}

// writeInitrd writes the base archive followed by the per-run archive (the
// /init script, the binary and the extra files) to path.
func writeInitrd(path, base string, o Options, mods []module) error {
	out, err := os.Create(path)
	if err != nil {
		return err
	}
	defer out.Close()
	b, err := os.Open(base)
	if err != nil {
		return err
	}
	_, err = io.Copy(out, b)
	b.Close()
	if err != nil {
		return err
	}
	c := newCpio(out)
	c.bytes("init", 0o755, []byte(initScript(o, mods)))
	c.file(vmBinary, o.Binary)
	have := map[string]bool{}
	for _, d := range baseDirs {
		have["/"+d] = true
	}
	vmPaths := make([]string, 0, len(o.Files))
	for p := range o.Files {
		vmPaths = append(vmPaths, p)
	}
	sort.Strings(vmPaths)
	for _, p := range vmPaths {
		if !strings.HasPrefix(p, "/") || p == "/init" || p == vmBinary {
			return fmt.Errorf("vmtest: Files: %q must be absolute and not /init or %s", p, vmBinary)
		}
		var parents []string
		for d := filepath.Dir(p); d != "/" && !have[d]; d = filepath.Dir(d) {
			parents = append(parents, d)
			have[d] = true
		}
		for i := len(parents) - 1; i >= 0; i-- {
			c.dir(parents[i])
		}
		// The VM has no shared libraries: refuse a dynamic ELF here rather
		// than fail obscurely inside.
		if ok, err := isStatic(o.Files[p]); err == nil && !ok {
			return fmt.Errorf("vmtest: Files: %s is dynamically linked; the VM has no shared libraries (build with CGO_ENABLED=0)", o.Files[p])
		}
		c.file(p, o.Files[p])
	}
	if err := c.close(); err != nil {
		return err
	}
	return out.Close()
}

// initScript is the VM's /init: mount the pseudo file systems, load the
// modules, run the binary and print its exit status, then power off (with
// -no-reboot, a reboot ends QEMU).
func initScript(o Options, mods []module) string {
	var b strings.Builder
	b.WriteString(`#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin HOME=/root TMPDIR=/tmp
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /tmp
fail() { echo; echo "` + sentinelError + `$*"; reboot -f; sleep 60; }
`)
	for _, m := range mods {
		fmt.Fprintf(&b, "insmod /lib/modules/%s || fail %s\n", shellQuote(m.name), shellQuote("insmod "+m.name+" failed"))
	}
	b.WriteString("ip link set lo up || fail 'ip link set lo up failed'\n")
	b.WriteString("cd /tmp\necho " + sentinelStart + "\n")
	b.WriteString("env " + EnvInVM + "=1")
	for _, e := range o.Env {
		b.WriteString(" " + shellQuote(e))
	}
	b.WriteString(" " + vmBinary)
	for _, a := range o.Args {
		b.WriteString(" " + shellQuote(a))
	}
	b.WriteString("\nrc=$?\necho\necho \"" + sentinelExit + "$rc\"\nreboot -f\nsleep 60\n")
	return b.String()
}

// shellQuote quotes s for a POSIX shell.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// EnvAccel set to "kvm" runs the VMs with KVM instead of the default TCG
// ("tcg"); use it where /dev/kvm is known to boot guests.
const EnvAccel = "WEIR_VMTEST_ACCEL"

// EnvRun set to "1" runs the VM tests even when -run selects nothing.
const EnvRun = "WEIR_VMTEST"

// Require skips t unless VM tests were asked for and this host can boot a
// VM. A VM test costs a minute or more of emulated CPU, so a plain
// `go test ./...` skips them; they run when -run names tests (`make vmtest`
// passes -run VM) or with WEIR_VMTEST=1. Boot and RunTest call it.
func Require(t testing.TB) {
	t.Helper()
	if !selected() {
		t.Skip("vmtest: VM tests run only when asked for: `sudo make vmtest`, `go test -run VM ./vmtest/`, or " + EnvRun + "=1")
	}
	if err := Available(); err != nil {
		t.Skip(err)
	}
}

// selected reports whether VM tests were asked for: EnvRun=1, or any
// -test.run pattern.
func selected() bool {
	if os.Getenv(EnvRun) == "1" {
		return true
	}
	f := flag.Lookup("test.run")
	return f != nil && f.Value.String() != ""
}

// Boot runs o in a VM for test t: it skips t as Require does, streams the console to t's log, fails t when the
// run fails or the binary exits non-zero, and logs the boot and total times.
func Boot(t testing.TB, o Options) Result {
	t.Helper()
	Require(t)
	if o.Console == nil {
		lw := &lineLogger{t: t}
		o.Console = lw
	}
	res, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("vmtest: accel %s, boot %v, total %v, exit %d",
		res.Accel, res.Boot.Round(time.Millisecond), res.Total.Round(time.Millisecond), res.ExitCode)
	if res.ExitCode != 0 {
		t.Fatalf("vmtest: %s exited with status %d inside the VM", filepath.Base(o.Binary), res.ExitCode)
	}
	return res
}

// lineLogger logs each console line as it arrives (with -v the lines
// stream while the VM runs).
type lineLogger struct {
	t   testing.TB
	buf bytes.Buffer
}

func (l *lineLogger) Write(p []byte) (int, error) {
	l.buf.Write(p)
	for {
		i := bytes.IndexByte(l.buf.Bytes(), '\n')
		if i < 0 {
			return len(p), nil
		}
		l.t.Logf("vm| %s", l.buf.Next(i + 1)[:i])
	}
}

var testBinary struct {
	once sync.Once
	path string
	err  error
}

// TestBinary returns a static build of the running test binary: the
// binary itself when it is already static, or else one built with
// `go test -c` and CGO_ENABLED=0 from the current folder (go test runs a
// package's tests in its folder). It is built once per process.
func TestBinary() (string, error) {
	testBinary.once.Do(func() {
		self, err := os.Executable()
		if err == nil {
			if ok, serr := isStatic(self); serr == nil && ok {
				testBinary.path = self
				return
			}
		}
		dir := filepath.Join(defaultCacheDir(), "bin")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			testBinary.err = err
			return
		}
		out := filepath.Join(dir, strings.TrimSuffix(filepath.Base(self), ".test")+".static.test")
		cmd := exec.Command("go", "test", "-c", "-o", out, ".")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if msg, err := cmd.CombinedOutput(); err != nil {
			testBinary.err = fmt.Errorf("vmtest: go test -c: %v\n%s", err, msg)
			return
		}
		testBinary.path = out
	})
	return testBinary.path, testBinary.err
}

var weirBinary struct {
	once sync.Once
	path string
	err  error
}

// WeirBinary returns a static weir binary to put into the VM (Options.Files
// "/bin/weir"): bin/weir of the module when it is static, or else one built
// from cmd/weir with CGO_ENABLED=0 into the cache folder, once per process.
// It must run inside the weir module (go test runs in the package folder).
func WeirBinary() (string, error) {
	weirBinary.once.Do(func() {
		out, err := exec.Command("go", "env", "GOMOD").Output()
		if err != nil {
			weirBinary.err = fmt.Errorf("vmtest: go env GOMOD: %w", err)
			return
		}
		root := filepath.Dir(strings.TrimSpace(string(out)))
		built := filepath.Join(root, "bin", "weir")
		if ok, err := isStatic(built); err == nil && ok {
			weirBinary.path = built
			return
		}
		dir := filepath.Join(defaultCacheDir(), "bin")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			weirBinary.err = err
			return
		}
		path := filepath.Join(dir, "weir")
		cmd := exec.Command("go", "build", "-o", path, "./cmd/weir")
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if msg, err := cmd.CombinedOutput(); err != nil {
			weirBinary.err = fmt.Errorf("vmtest: go build ./cmd/weir: %v\n%s", err, msg)
			return
		}
		weirBinary.path = path
	})
	return weirBinary.path, weirBinary.err
}

// RunTest runs the calling test, t.Name(), inside a VM: it boots with the
// static test binary as o.Binary and -test.run selecting exactly t, with
// -test.v so its log streams back. Scenario tests use it as
//
//	func TestVMSomething(t *testing.T) {
//		if !vmtest.InVM() {
//			vmtest.RunTest(t, vmtest.Options{Modules: []string{"veth"}})
//			return
//		}
//		// the scenario, running inside the VM as root
//	}
//
// Any o.Binary and o.Args are replaced.
func RunTest(t *testing.T, o Options) Result {
	t.Helper()
	Require(t)
	bin, err := TestBinary()
	if err != nil {
		t.Fatal(err)
	}
	o.Binary = bin
	o.Args = []string{"-test.run=^" + runPattern(t.Name()) + "$", "-test.v", "-test.count=1"}
	return Boot(t, o)
}

// runPattern turns a test name (with subtests, slash separated) into a
// -test.run pattern matching exactly it.
func runPattern(name string) string {
	parts := strings.Split(name, "/")
	for i, p := range parts {
		var b strings.Builder
		for _, r := range p {
			if strings.ContainsRune(`\.+*?()|[]{}^$`, r) {
				b.WriteByte('\\')
			}
			b.WriteRune(r)
		}
		parts[i] = b.String()
	}
	return strings.Join(parts, "$/^")
}
