//go:build linux

package e2e

import (
	"bytes"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"weir/internal/testutil"
)

// TestDemo runs the built `weir demo` as a user would and checks its
// summary: every scenario of the seeds shown, and each one ok. It is of the
// soak tier (make soak): 20 s of timing-bound scenarios.
func TestDemo(t *testing.T) {
	if testing.Short() {
		// The loss scenario judges real TCP timing and the distribution
		// scenario a 2 % share bound, over 20 s: a long, timing-bound
		// run that make soak does and -short skips.
		t.Skip("skipping: weir demo's scenarios are timing-bound measurements (make soak runs them)")
	}
	checkDemo(t, "demo")
}

// TestDemoTUN runs the demo with its clients behind a real TUN in a network
// namespace of their own (root only; make e2e).
func TestDemoTUN(t *testing.T) {
	if testing.Short() {
		t.Skip("skipping: weir demo --tun is an end-to-end run of the built binary (make e2e runs it, as root)")
	}
	if os.Geteuid() != 0 {
		t.Skip("weir demo --tun needs root (a TUN in a new network namespace); run as root to test it")
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		t.Skip("no /dev/net/tun")
	}
	checkDemo(t, "demo", "--tun")
}

func checkDemo(t *testing.T, args ...string) {
	t.Helper()
	if testutil.Race {
		// The demo's loss scenario judges real TCP timing: under the race
		// detector the stacks run ~10× slower, gVisor's tail-loss probes
		// fire before ACKs are processed and read as loss on clean legs.
		t.Skip("weir demo measures TCP timing; not meaningful under -race (make soak runs it)")
	}
	var out, errb bytes.Buffer
	cmd := exec.Command(weirBinary(t), args...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	text := out.String()
	if err != nil {
		t.Fatalf("weir %s: %v\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), err, text, errb.String())
	}
	i := strings.Index(text, "== summary")
	if i < 0 {
		t.Fatalf("no summary:\n%s", text)
	}
	summary := text[i:]
	for _, want := range []string{
		`weighted distribution\s+ok\s+300/300 OK over 4:2:4`,
		`MaxConnections\s+ok\s+7 served at once \(3\+4\), 23 got 503 naming the limits`,
		`loss moves weight\s+ok\s+\d+ packets dropped; carol's to_target loss read \d+\.\d%, loss fraction reached [1-9]\d*%`,
		// The seed's direction: the target's own segments, downloads. The
		// scenario is ok only if carol's from_target loss read within a
		// factor 2 of the injected 5 %, her weight was cut, her share fell
		// and her weight came back.
		`download loss moves weight\s+ok\s+\d+ packets dropped; carol's from_target loss read \d+\.\d%, loss fraction reached [1-9]\d*%`,
		`ToS marking\s+ok\s+\d+ packets marked over 20 connections`,
		`wasmember05 \(at limit 3/3\), wasmember06 \(at limit 4/4\)`,
	} {
		if !regexp.MustCompile(want).MatchString(text) {
			t.Errorf("demo output lacks %q\nsummary:\n%s", want, summary)
		}
	}
}
