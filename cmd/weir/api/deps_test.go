package api_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestStatusClientLinksNoGVisor keeps `weir status` and every other reader
// of the status document light: the document itself depends on the standard
// library only, and the packages that serve and print it (admin, view) link
// neither gVisor nor the datapath nor the appliance.
func TestStatusClientLinksNoGVisor(t *testing.T) {
	forbidden := []string{
		"gvisor.dev/gvisor",
		"weir/netstack",
		"weir/datapath",
		"weir/balancer",
		"weir/policy",
		"weir/cmd/weir/internal/appliance",
		"weir/bench",
	}
	for _, pkg := range []string{"weir/cmd/weir/api", "weir/cmd/weir/internal/view", "weir/cmd/weir/internal/admin", "weir/cmd/weir/internal/metrics"} {
		for _, dep := range deps(t, pkg) {
			for _, f := range forbidden {
				if dep == f || strings.HasPrefix(dep, f+"/") {
					t.Errorf("%s depends on %s", pkg, dep)
				}
			}
		}
	}
	for _, dep := range deps(t, "weir/cmd/weir/api") {
		if first, _, _ := strings.Cut(dep, "/"); strings.Contains(first, ".") || (first == "weir" && dep != "weir/cmd/weir/api") {
			t.Errorf("weir/cmd/weir/api depends on %s; it may use the standard library only", dep)
		}
	}
}

func deps(t *testing.T, pkg string) []string {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", pkg).CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps %s: %v\n%s", pkg, err, out)
	}
	return strings.Fields(string(out))
}
