package vmtest

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// cpioEntry is one entry as readCpio parses it back.
type cpioEntry struct {
	name         string
	mode         uint32
	rmaj, rmin   uint32
	data         string
	headerOffset int
}

// readCpio parses newc archives (several may be concatenated) the way the
// kernel does, checking alignment and magic, so the writer is tested
// against the format rather than against itself.
func readCpio(t *testing.T, b []byte) []cpioEntry {
	t.Helper()
	var out []cpioEntry
	off := 0
	align := func(n int) int { return (n + 3) &^ 3 }
	for off < len(b) {
		if len(b)-off < 110 {
			t.Fatalf("truncated header at %d", off)
		}
		h := b[off : off+110]
		if string(h[:6]) != "070701" {
			t.Fatalf("bad magic %q at %d", h[:6], off)
		}
		field := func(i int) uint32 {
			v, err := strconv.ParseUint(string(h[6+8*i:6+8*i+8]), 16, 32)
			if err != nil {
				t.Fatalf("field %d at %d: %v", i, off, err)
			}
			return uint32(v)
		}
		mode, size, rmaj, rmin, namesize := field(1), field(6), field(9), field(10), field(11)
		nameEnd := off + 110 + int(namesize)
		if b[nameEnd-1] != 0 {
			t.Fatalf("name at %d not NUL terminated", off)
		}
		e := cpioEntry{name: string(b[off+110 : nameEnd-1]), mode: mode, rmaj: rmaj, rmin: rmin, headerOffset: off}
		dataStart := align(nameEnd)
		e.data = string(b[dataStart : dataStart+int(size)])
		off = align(dataStart + int(size))
		out = append(out, e)
	}
	return out
}

func TestCpioNewc(t *testing.T) {
	src := filepath.Join(t.TempDir(), "src")
	if err := os.WriteFile(src, []byte("hello, file"), 0o640); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	for range 2 { // two archives back to back, as the initrd is built
		c := newCpio(&buf)
		c.dir("dev")
		c.charDev("dev/console", 5, 1)
		c.bytes("/init", 0o755, []byte("#!/bin/sh\n"))
		c.file("bin/x", src)
		c.symlink("bin/sh", "busybox")
		if err := c.close(); err != nil {
			t.Fatal(err)
		}
	}
	got := readCpio(t, buf.Bytes())
	want := []cpioEntry{
		{name: "dev", mode: modeDir | 0o755},
		{name: "dev/console", mode: modeCharDev | 0o600, rmaj: 5, rmin: 1},
		{name: "init", mode: modeFile | 0o755, data: "#!/bin/sh\n"},
		{name: "bin/x", mode: modeFile | 0o640, data: "hello, file"},
		{name: "bin/sh", mode: modeSymlink | 0o777, data: "busybox"},
		{name: "TRAILER!!!"},
	}
	if len(got) != 2*len(want) {
		t.Fatalf("got %d entries, want %d", len(got), 2*len(want))
	}
	for i, g := range got {
		w := want[i%len(want)]
		if g.headerOffset%4 != 0 {
			t.Errorf("entry %d (%s) starts at %d, not 4-aligned", i, g.name, g.headerOffset)
		}
		g.headerOffset = 0
		if g != w {
			t.Errorf("entry %d = %+v, want %+v", i, g, w)
		}
	}
}

func TestCpioErrorSticks(t *testing.T) {
	var buf bytes.Buffer
	c := newCpio(&buf)
	c.file("x", filepath.Join(t.TempDir(), "missing"))
	c.bytes("y", 0o644, []byte("y"))
	if err := c.close(); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Fatalf("close = %v, want the missing file's error", err)
	}
	if buf.Len() != 0 {
		t.Errorf("wrote %d bytes after an error", buf.Len())
	}
}

func TestModuleOrder(t *testing.T) {
	dir := t.TempDir()
	dep := `kernel/net/sched/sch_netem.ko:
kernel/drivers/net/veth.ko:
kernel/a/top.ko: kernel/a/mid.ko kernel/a/base.ko
kernel/a/mid.ko: kernel/a/base.ko
kernel/a/base.ko:
kernel/a/other-dash.ko.xz: kernel/a/base.ko
`
	if err := os.WriteFile(filepath.Join(dir, "modules.dep"), []byte(dep), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "modules.builtin"), []byte("kernel/drivers/net/tun.ko\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		names []string
		want  string // insmod order, space separated
		err   string
	}{
		{names: nil, want: ""},
		{names: []string{"veth", "sch_netem"}, want: "veth.ko sch_netem.ko"},
		{names: []string{"tun"}, want: ""}, // built in
		{names: []string{"top"}, want: "base.ko mid.ko top.ko"},
		{names: []string{"other_dash", "top"}, want: "base.ko other-dash.ko.xz mid.ko top.ko"},
		{names: []string{"nope"}, err: "nope is neither"},
	} {
		t.Run(strings.Join(tc.names, ","), func(t *testing.T) {
			mods, err := moduleOrder(dir, tc.names)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, m := range mods {
				names = append(names, m.name)
				if !strings.HasPrefix(m.path, dir+"/kernel/") {
					t.Errorf("path %s not under the modules dir", m.path)
				}
			}
			if got := strings.Join(names, " "); got != tc.want {
				t.Errorf("order %q, want %q", got, tc.want)
			}
		})
	}
}

func TestRunPatternMatchesExactlyOneTest(t *testing.T) {
	for _, tc := range []struct {
		name  string
		match []string
		miss  []string
	}{
		{"TestVMNetemLoss", []string{"TestVMNetemLoss"}, []string{"TestVMNetemLossX", "XTestVMNetemLoss", "TestVMNetemLoss/sub"}},
		{"TestA/sub.1", []string{"TestA/sub.1"}, []string{"TestA/subx1", "TestA/sub.12", "TestA"}},
	} {
		// RunTest passes "^" + pattern + "$"; go test splits -test.run at
		// slashes and matches each level against one part of the name.
		full := "^" + runPattern(tc.name) + "$"
		levels := strings.Split(full, "/")
		match := func(name string) bool {
			parts := strings.Split(name, "/")
			if len(parts) != len(levels) {
				return false
			}
			for i, l := range levels {
				if !regexp.MustCompile(l).MatchString(parts[i]) {
					return false
				}
			}
			return true
		}
		for _, m := range tc.match {
			if !match(m) {
				t.Errorf("pattern %q does not match %q", full, m)
			}
		}
		for _, m := range tc.miss {
			if match(m) {
				t.Errorf("pattern %q matches %q", full, m)
			}
		}
	}
}

func TestInitScript(t *testing.T) {
	s := initScript(Options{
		Args: []string{"-test.run=^TestX$", "it's"},
		Env:  []string{"A=b c"},
	}, []module{{name: "veth.ko"}, {name: "sch_netem.ko"}})
	for _, want := range []string{
		"#!/bin/busybox sh\n",
		"insmod /lib/modules/'veth.ko' || fail 'insmod veth.ko failed'\ninsmod /lib/modules/'sch_netem.ko'",
		"echo VMTEST-START\nenv WEIR_IN_VM=1 'A=b c' /test '-test.run=^TestX$' 'it'\\''s'\n",
		`echo "VMTEST-EXIT=$rc"`,
		"reboot -f",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("init script lacks %q:\n%s", want, s)
		}
	}
}

func TestScanConsole(t *testing.T) {
	for _, tc := range []struct {
		console string
		exit    int
		problem string
		booted  bool
	}{
		{"boot noise\r\nVMTEST-START\r\n=== RUN TestX\r\n--- PASS\r\n\r\nVMTEST-EXIT=0\r\n", 0, "", true},
		{"VMTEST-START\nFAIL\nVMTEST-EXIT=1\n", 1, "", true},
		{"\x1bc\x1b[?7l\x1b[2JVMTEST-START\nno newline at the endVMTEST-EXIT=3\n", 3, "", true},
		{"\nVMTEST-ERROR=insmod veth.ko failed\n", -1, "insmod veth.ko failed", false},
		{"Kernel panic - not syncing\n", -1, "", false},
	} {
		var copied bytes.Buffer
		var res Result
		exit, problem, tail := scanConsole(strings.NewReader(tc.console), &copied, time.Now(), &res)
		if exit != tc.exit || problem != tc.problem || (res.Boot > 0) != tc.booted {
			t.Errorf("%q: exit %d problem %q booted %v, want %d %q %v", tc.console, exit, problem, res.Boot > 0, tc.exit, tc.problem, tc.booted)
		}
		if want := stripEscapes(strings.ReplaceAll(tc.console, "\r", "")); copied.String() != want || strings.Contains(want, "\x1b") {
			t.Errorf("console copy %q, want %q", copied.String(), want)
		}
		if first, _, _ := strings.Cut(copied.String(), "\n"); !strings.HasPrefix(tail, first) {
			t.Errorf("tail %q lacks the first line", tail)
		}
	}
}

func TestVersionLess(t *testing.T) {
	sorted := []string{"/boot/vmlinuz-6.1.0-9-amd64", "/boot/vmlinuz-6.1.0-57-amd64", "/boot/vmlinuz-6.9.2-amd64", "/boot/vmlinuz-6.10.0-1-amd64"}
	for i := range sorted {
		for j := range sorted {
			if got := versionLess(sorted[i], sorted[j]); got != (i < j) {
				t.Errorf("versionLess(%s, %s) = %v", sorted[i], sorted[j], got)
			}
		}
	}
}

func TestResolveSaysWhatToInstall(t *testing.T) {
	dir := t.TempDir()
	kernel := filepath.Join(dir, "vmlinuz-1.2.3-test")
	notELF := filepath.Join(dir, "busybox")
	for _, p := range []string{kernel, notELF} {
		if err := os.WriteFile(p, []byte("not an ELF file"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name string
		o    Options
		want string
	}{
		{"no qemu", Options{QEMU: "weir-no-such-qemu"}, "no weir-no-such-qemu"},
		{"no kernel", Options{QEMU: "true", Kernel: filepath.Join(dir, "vmlinuz-9")}, "kernel image not readable"},
		{"kernel without version", Options{QEMU: "true", Kernel: notELF}, "set Options.ModulesDir"},
		{"busybox not ELF", Options{QEMU: "true", Kernel: kernel, Busybox: notELF}, notELF},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.o.resolve()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("resolve = %v, want an error containing %q", err, tc.want)
			}
			if tc.name != "kernel without version" && !strings.Contains(err.Error(), "sudo scripts/vm-deps.sh") {
				t.Errorf("error %q does not say how to install", err)
			}
		})
	}
	t.Run("defaults", func(t *testing.T) {
		if ok, err := isStatic("/bin/busybox"); err != nil || !ok {
			t.Skip("no static /bin/busybox on this host")
		}
		o := Options{QEMU: "true", Kernel: kernel}
		if err := o.resolve(); err != nil {
			t.Fatal(err)
		}
		if o.ModulesDir != "/lib/modules/1.2.3-test" || o.MemoryMiB != 512 || o.CPUs != 2 ||
			o.Timeout != 5*time.Minute || o.Busybox != "/bin/busybox" || o.CacheDir == "" || o.Console == nil {
			t.Errorf("defaults not filled: %+v", o)
		}
	})
}

func TestInitrdLayoutAndCache(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	o := Options{
		Busybox:  write("busybox", "fake busybox"),
		Binary:   write("prog", "fake program"),
		Files:    map[string]string{"/opt/weir/data": write("data", "payload"), "/etc/x": write("x", "x")},
		CacheDir: filepath.Join(dir, "cache"),
	}
	mods := []module{{name: "veth.ko", path: write("veth.ko", "fake module")}}
	base, err := baseArchive(o, mods)
	if err != nil {
		t.Fatal(err)
	}
	st1, err := os.Stat(base)
	if err != nil {
		t.Fatal(err)
	}
	again, err := baseArchive(o, mods)
	if err != nil {
		t.Fatal(err)
	}
	st2, _ := os.Stat(again)
	if again != base || !st2.ModTime().Equal(st1.ModTime()) {
		t.Errorf("second baseArchive rebuilt: %s then %s", base, again)
	}
	if other, err := baseArchive(o, nil); err != nil || other == base {
		t.Errorf("a different module set shares the cache entry (%s, %v)", other, err)
	}

	initrd := filepath.Join(dir, "initrd")
	if err := writeInitrd(initrd, base, o, mods); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(initrd)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	contents := map[string]string{}
	for _, e := range readCpio(t, b) {
		names = append(names, e.name)
		contents[e.name] = e.data
	}
	want := "bin dev etc lib lib/modules proc sys tmp root dev/console dev/null bin/busybox lib/modules/veth.ko TRAILER!!! " +
		"init test etc/x opt opt/weir opt/weir/data TRAILER!!!"
	if got := strings.Join(names, " "); got != want {
		t.Errorf("entries\n%s\nwant\n%s", got, want)
	}
	for name, w := range map[string]string{"bin/busybox": "fake busybox", "test": "fake program", "opt/weir/data": "payload", "lib/modules/veth.ko": "fake module"} {
		if contents[name] != w {
			t.Errorf("%s = %q, want %q", name, contents[name], w)
		}
	}
	if !strings.Contains(contents["init"], "insmod /lib/modules/'veth.ko'") {
		t.Errorf("init does not load the module:\n%s", contents["init"])
	}

	for _, bad := range []map[string]string{{"relative": o.Binary}, {"/init": o.Binary}, {"/test": o.Binary}} {
		o2 := o
		o2.Files = bad
		if err := writeInitrd(initrd, base, o2, mods); err == nil {
			t.Errorf("Files %v accepted", bad)
		}
	}
	if ok, err := isStatic("/bin/sh"); err == nil && !ok {
		o2 := o
		o2.Files = map[string]string{"/bin/dyn": "/bin/sh"}
		if err := writeInitrd(initrd, base, o2, mods); err == nil || !strings.Contains(err.Error(), "dynamically linked") {
			t.Errorf("a dynamic ELF in Files: err = %v", err)
		}
	}
}

func TestSelected(t *testing.T) {
	f := flag.Lookup("test.run")
	if f == nil {
		t.Fatal("no test.run flag")
	}
	old := f.Value.String()
	t.Cleanup(func() { _ = f.Value.Set(old) })
	for _, tc := range []struct {
		env, run string
		want     bool
	}{
		{"", "", false},
		{"0", "", false},
		{"1", "", true},
		{"", "VM", true},
	} {
		t.Setenv(EnvRun, tc.env)
		if err := f.Value.Set(tc.run); err != nil {
			t.Fatal(err)
		}
		if got := selected(); got != tc.want {
			t.Errorf("%s=%q -run %q: selected = %v, want %v", EnvRun, tc.env, tc.run, got, tc.want)
		}
	}
}
