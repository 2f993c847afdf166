package vmtest_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"weir/vmtest"
)

// exitStatusInVM is the status the VM side of TestVMExitStatus exits with
// when everything it checks holds; the host expects exactly it.
const exitStatusInVM = 7

// TestVMExitStatus checks the harness itself end to end: a file from
// Options.Files arrives intact, the static weir binary runs inside the VM,
// and the program's exit status (not 0, to tell it from a plain pass)
// comes back as Result.ExitCode.
func TestVMExitStatus(t *testing.T) {
	if vmtest.InVM() {
		exitStatusVMSide(t)
		return
	}
	vmtest.Require(t)
	bin, err := vmtest.TestBinary()
	if err != nil {
		t.Fatal(err)
	}
	weir, err := vmtest.WeirBinary()
	if err != nil {
		t.Fatal(err)
	}
	probe := filepath.Join(t.TempDir(), "probe")
	const content = "probe 198.18.0.1\n"
	if err := os.WriteFile(probe, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	var console bytes.Buffer
	res, err := vmtest.Run(context.Background(), vmtest.Options{
		Binary:    bin,
		Args:      []string{"-test.run=^TestVMExitStatus$", "-test.v"},
		Env:       []string{"VMTEST_PROBE=" + content},
		Files:     map[string]string{"/etc/weir/probe": probe, "/bin/weir": weir},
		CPUs:      1,
		MemoryMiB: 256,
		Timeout:   3 * time.Minute,
		Console:   &console,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("vmtest: accel %s, boot %v, total %v", res.Accel, res.Boot.Round(time.Millisecond), res.Total.Round(time.Millisecond))
	if res.ExitCode != exitStatusInVM {
		t.Fatalf("exit status %d, want %d; console:\n%s", res.ExitCode, exitStatusInVM, console.String())
	}
	if res.Boot <= 0 || res.Boot >= res.Total {
		t.Errorf("boot time %v outside (0, total %v)", res.Boot, res.Total)
	}
	if !strings.Contains(console.String(), "weir in VM: ") {
		t.Errorf("console lacks the VM side's report:\n%s", console.String())
	}
}

// exitStatusVMSide runs inside the VM: it checks the probe file and weir,
// then exits with exitStatusInVM, or fails the test (status 1).
func exitStatusVMSide(t *testing.T) {
	got, err := os.ReadFile("/etc/weir/probe")
	if err != nil {
		t.Fatal(err)
	}
	if want := os.Getenv("VMTEST_PROBE"); string(got) != want {
		t.Fatalf("/etc/weir/probe = %q, want %q", got, want)
	}
	out, err := exec.Command("/bin/weir", "version").CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) == 0 {
		t.Fatalf("/bin/weir version: %v, output %q", err, out)
	}
	t.Logf("weir in VM: %s", bytes.TrimSpace(out))
	os.Exit(exitStatusInVM)
}

// TestVMTimeoutKillsQEMU checks that Options.Timeout ends a VM that runs
// too long (here: still booting, or sleeping inside) and that Run says so.
func TestVMTimeoutKillsQEMU(t *testing.T) {
	if vmtest.InVM() {
		time.Sleep(time.Minute) // the host kills the VM long before
		return
	}
	vmtest.Require(t)
	bin, err := vmtest.TestBinary()
	if err != nil {
		t.Fatal(err)
	}
	const timeout = 3 * time.Second
	res, err := vmtest.Run(context.Background(), vmtest.Options{
		Binary:  bin,
		Args:    []string{"-test.run=^TestVMTimeoutKillsQEMU$"},
		CPUs:    1,
		Timeout: timeout,
	})
	if err == nil || !strings.Contains(err.Error(), "VM killed after") {
		t.Fatalf("Run = %+v, %v; want the timeout error", res, err)
	}
	// QEMU is killed at the timeout; WaitDelay (5 s) bounds the rest.
	if res.Total < timeout || res.Total > timeout+10*time.Second {
		t.Errorf("Run took %v with a %v timeout", res.Total, timeout)
	}
}
