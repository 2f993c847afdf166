package host

import (
	"errors"
	"os"
	"runtime/debug"
	"strings"
	"testing"
)

func TestPlanDrop(t *testing.T) {
	p, err := PlanDrop("nobody")
	if err != nil {
		t.Skipf("no user nobody: %v", err)
	}
	if p.UID == 0 || p.GID == 0 || len(p.Groups) == 0 {
		t.Errorf("nobody: %+v", p)
	}
	if q, err := PlanDrop("4242"); err != nil || q.UID != 4242 {
		t.Errorf("a numeric uid without a passwd entry: %+v %v", q, err)
	}
	for _, bad := range []string{"root", "0", "no-such-user-weir"} {
		if _, err := PlanDrop(bad); err == nil {
			t.Errorf("PlanDrop(%q) accepted", bad)
		}
	}
}

// TestDropNeedsAStaticBuild: in a cgo build (this test binary, normally)
// DropPrivileges refuses before it changes anything, and says why.
func TestDropNeedsAStaticBuild(t *testing.T) {
	bi, ok := debug.ReadBuildInfo()
	cgo := false
	for _, s := range bi.Settings {
		if s.Key == "CGO_ENABLED" && s.Value == "1" {
			cgo = true
		}
	}
	if !ok || !cgo {
		t.Skip("skipping: a static test binary would really drop its own privileges")
	}
	before, _ := os.ReadFile("/proc/self/status")
	if err := DropPrivileges(nil); !errors.Is(err, ErrCgo) {
		t.Fatalf("DropPrivileges in a cgo build = %v, want ErrCgo", err)
	}
	after, _ := os.ReadFile("/proc/self/status")
	capLines := func(b []byte) (out []string) {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "Cap") || strings.HasPrefix(l, "Uid") || strings.HasPrefix(l, "NoNewPrivs") {
				out = append(out, l)
			}
		}
		return out
	}
	if b, a := capLines(before), capLines(after); strings.Join(b, "\n") != strings.Join(a, "\n") {
		t.Errorf("a refused drop changed the process:\n%v\n%v", b, a)
	}
}
