package main

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRunRefusesBadInput: every bad flag of weir run stops it before it
// touches the system, with exit status 1 and a message naming the flag.
// None of these cases needs root: each fails before the root check.
func TestRunRefusesBadInput(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "weir.yaml")
	if err := os.WriteFile(good, []byte("services: []\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("bogus: 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(dir, "empty-token")
	if err := os.WriteFile(empty, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		args []string
		want string // in stderr
	}{
		{"tun name of 17 bytes", []string{"run", "-c", good, "--tun", "abcdefghijklmnopq"}, `--tun: tun: interface name "abcdefghijklmnopq" is 17 bytes long; Linux allows at most 15`},
		{"tun name of 16 bytes", []string{"run", "-c", good, "--tun", "abcdefghijklmnop"}, "at most 15"},
		{"empty tun name", []string{"run", "-c", good, "--tun", ""}, "--tun: tun: empty interface name"},
		{"tun name with a slash", []string{"run", "-c", good, "--tun", "a/b"}, "contains '/'"},
		{"no queues", []string{"run", "-c", good, "--queues", "0"}, "--queues 0: want at least 1"},
		{"negative queues", []string{"run", "-c", good, "--queues", "-2"}, "--queues -2: want at least 1"},
		{"negative history", []string{"run", "-c", good, "--history", "-1"}, "--history -1: want 1..1048576 samples (0: 720)"},
		{"queues not a number", []string{"run", "-c", good, "--queues", "two"}, `invalid argument "two" for "--queues"`},
		{"tiny mtu", []string{"run", "-c", good, "--mtu", "100"}, "--mtu 100: want 576..65535"},
		{"no config", []string{"run"}, "run: no config file (give -c FILE)"},
		{"two configs", []string{"run", "a.yaml", "b.yaml"}, "accepts at most 1 arg"},
		{"unknown flag", []string{"run", "-c", good, "--bogus"}, "unknown flag: --bogus"},
		{"unknown command", []string{"runn"}, `unknown command "runn"`},
		{"bad tun address", []string{"run", "-c", good, "--tun-addr", "198.18.0.1"}, `--tun-addr "198.18.0.1"`},
		{"public admin without a token", []string{"run", "-c", good, "--admin", "0.0.0.0:9090"}, "0.0.0.0:9090"},
		{"token file missing", []string{"run", "-c", good, "--admin-token-file", filepath.Join(dir, "none")}, "--admin-token-file: open"},
		{"token file empty", []string{"run", "-c", good, "--admin-token-file", empty}, "holds no token"},
		{"token twice", []string{"run", "-c", good, "--admin-token-file", empty, "--admin-token", "x"}, "both given"},
		{"capture-max without capture", []string{"run", "-c", good, "--capture-max", "1MiB"}, "--capture-max needs --capture FILE"},
		{"capture-max too small", []string{"run", "-c", good, "--capture", "x.pcap", "--capture-max", "10"}, "--capture-max 10: want at least 1KiB"},
		{"capture-max not a size", []string{"run", "-c", good, "--capture", "x.pcap", "--capture-max", "lots"}, "want a byte count"},
		{"offload not a mode", []string{"run", "-c", good, "--offload", "yes"}, `--offload: offload "yes": want auto, on or off`},
		{"offload on with capture", []string{"run", "-c", good, "--offload", "on", "--capture", "x.pcap"}, "--capture records packets up to the MTU"},
		{"config error", []string{"run", "-c", bad}, bad + `:1:1: unknown key "bogus" in config`},
		{"missing config", []string{"run", "-c", filepath.Join(dir, "none.yaml")}, "no such file"},
		{"unknown user", []string{"run", "-c", good, "--user", "no-such-user-weir"}, `--user: no user "no-such-user-weir"`},
		{"user root", []string{"run", "-c", good, "--user", "root"}, `user "root" is root`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out, errs := run(tt.args...)
			if code != exitUsage {
				t.Errorf("exit %d, want %d; stderr %q", code, exitUsage, errs)
			}
			if !strings.Contains(errs, tt.want) {
				t.Errorf("stderr %q does not say %q", errs, tt.want)
			}
			if out != "" && !strings.HasPrefix(out, "Flag --admin-token has been deprecated") {
				t.Errorf("stdout %q", out)
			}
		})
	}
}

// TestRunRuntimeFailureExits2: a right command line the system refuses
// (here the admin port is taken; without root, the root check) is exit
// status 2, before any TUN exists.
func TestRunRuntimeFailureExits2(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cfg := filepath.Join(t.TempDir(), "weir.yaml")
	if err := os.WriteFile(cfg, []byte("services: []\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, _, errs := run("run", "-c", cfg, "--admin", ln.Addr().String(), "--tun", "weirx0", "--log-level", "error")
	if code != exitRuntime {
		t.Errorf("exit %d, want %d; stderr %q", code, exitRuntime, errs)
	}
	want := "is in use"
	if os.Geteuid() != 0 {
		want = "needs root"
	}
	if !strings.Contains(errs, want) {
		t.Errorf("stderr %q does not say %q", errs, want)
	}
}

// TestHelpShowsNoSecret: weir run --help names $WEIR_ADMIN_TOKEN but
// never prints its value.
func TestHelpShowsNoSecret(t *testing.T) {
	t.Setenv(adminTokenEnv, "s3cret-token-value")
	code, out, errs := run("run", "--help")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	if strings.Contains(out+errs, "s3cret") {
		t.Errorf("--help prints the token:\n%s", out)
	}
	for _, w := range []string{"--admin-token-file", "$WEIR_ADMIN_TOKEN", "--user", "--capture", "Exit status: 0", "1 for a usage or config error", "2 for a runtime failure"} {
		if !strings.Contains(out, w) {
			t.Errorf("--help does not mention %q", w)
		}
	}
}

// TestAdminToken: the token comes from --admin-token-file (its first
// line, trimmed), else from $WEIR_ADMIN_TOKEN, else the deprecated flag.
func TestAdminToken(t *testing.T) {
	file := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte("  from-file \nsecond line\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name, env, file, flag, want string
	}{
		{"file", "from-env", file, "", "from-file"},
		{"environment", "from-env", "", "", "from-env"},
		{"flag over environment", "from-env", "", "from-flag", "from-flag"},
		{"none", "", "", "", ""},
	} {
		t.Setenv(adminTokenEnv, tt.env)
		o := runOptions{config: "x", tunName: "weir0", queues: 1, mtu: 1500, captureMax: defaultCaptureMax, offload: "auto", tokenFile: tt.file}
		o.admin.Addr, o.admin.Token = "127.0.0.1:9090", tt.flag
		if err := o.check(newRunCmd()); err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		if o.admin.Token != tt.want {
			t.Errorf("%s: token %q, want %q", tt.name, o.admin.Token, tt.want)
		}
	}
}

func TestByteSize(t *testing.T) {
	var n int64
	b := byteSize{&n}
	for _, tt := range []struct {
		in   string
		want int64
		str  string
	}{
		{"1000", 1000, "1000"}, {"4KiB", 4096, "4KiB"}, {"64MiB", 64 << 20, "64MiB"}, {"10MB", 10e6, "10000000"},
		{"2kB", 2000, "2000"}, {"1GiB", 1 << 30, "1GiB"}, {"512B", 512, "512"},
	} {
		if err := b.Set(tt.in); err != nil || n != tt.want || b.String() != tt.str {
			t.Errorf("Set(%q): %d %q %v, want %d %q", tt.in, n, b.String(), err, tt.want, tt.str)
		}
	}
	for _, bad := range []string{"", "MB", "-1", "1TB", "1.5MiB", "lots"} {
		if err := b.Set(bad); err == nil {
			t.Errorf("Set(%q) accepted", bad)
		}
	}
}
