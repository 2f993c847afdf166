package weir_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestImportRules enforces the design's package ownership: the decision
// libraries and the datapath stay free of logging, config-file formats, flag
// parsing and gVisor, so they remain pure, fast and testable on their own.
func TestImportRules(t *testing.T) {
	forbiddenEverywhere := []string{
		"github.com/rs/zerolog",
		"go.yaml.in/yaml",
		"gopkg.in/yaml",
		"encoding/json",
		"flag",
		"gvisor.dev/gvisor",
		"weir/netstack",
		"weir/cmd",
	}
	rules := map[string][]string{
		"weir/policy":   append(forbiddenEverywhere, "weir/datapath", "weir/balancer"),
		"weir/balancer": append(forbiddenEverywhere, "weir/datapath"),
		"weir/datapath": append(forbiddenEverywhere, "weir/balancer"),
	}
	for root, bad := range rules {
		for _, pkg := range goList(t, root+"/...") {
			if pkg == "weir/policy/config" || strings.HasPrefix(pkg, "weir/policy/config/") {
				continue // the parser may use a YAML library; nothing else may.
			}
			for _, dep := range goList(t, "-deps", pkg) {
				for _, b := range bad {
					if dep == b || strings.HasPrefix(dep, b+"/") {
						t.Errorf("%s depends on %s, which the design forbids", pkg, dep)
					}
				}
			}
		}
	}
}

func goList(t *testing.T, args ...string) []string {
	t.Helper()
	args = append([]string{"list", "-f", "{{.ImportPath}}"}, args...)
	out, err := exec.Command("go", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("go %v: %v\n%s", args, err, out)
	}
	return strings.Fields(string(out))
}
