package weir_test

import (
	"os/exec"
	"slices"
	"sort"
	"strings"
	"testing"
)

// The design's package ownership, checked on the import graph of the
// non-test code (go list's Imports; _test files are free):
//
//   - the decision libraries and the datapath stay free of logging,
//     config-file formats, flag parsing and gVisor, so they remain pure, fast
//     and testable on their own;
//   - netstack holds all gVisor code but none of the control plane's
//     (logging, YAML, JSON, flags, cmd); netstack/proxy/... (the proxy
//     and netstack/proxy/http) holds none of gVisor either;
//   - the test lab (bench, datapath/fault, the lab, the demo, vmtest,
//     testutil and the <pkg>test doubles) never leaks into the product: a
//     product package reaches bench or datapath/fault only through the lab
//     or the demo, which `weir demo` links on purpose.

// forbidden is what the pure packages may not depend on, even indirectly.
var forbidden = []string{
	"github.com/rs/zerolog",
	"go.yaml.in/yaml",
	"gopkg.in/yaml",
	"encoding/json",
	"flag",
	"gvisor.dev/gvisor",
	"weir/netstack",
	"weir/cmd",
}

// testLab are the packages that exist for tests, benchmarks and the demo.
var testLab = []string{
	"weir/bench",
	"weir/datapath/fault",
	"weir/cmd/weir/internal/lab",
	"weir/cmd/weir/internal/demo",
	"weir/vmtest",
	"weir/internal/testutil",
}

// labOnly may be imported by no product package: only the test lab itself
// (and _test files) may use them.
var labOnly = []string{"weir/bench", "weir/datapath/fault", "weir/internal/testutil"}

type depRule struct {
	root string // the packages the rule applies to: root and root/...
	// except are packages under root the rule leaves out, with why.
	except []string
	// deps are forbidden anywhere in the package's dependencies; imports
	// only among its own direct imports (where a library it is allowed to
	// use, such as gVisor, may depend on them itself).
	deps, imports []string
}

var depRules = []depRule{
	// The decisions ask the system nothing (the host name is an input):
	// os is the config loader's.
	{root: "weir/policy", deps: append(slices.Clone(forbidden), "weir/datapath", "weir/balancer"), imports: []string{"os"},
		except: []string{"weir/policy/config"}}, // checked on its own below
	// The parser may use a YAML library; nothing else may.
	{root: "weir/policy/config", deps: append(without(forbidden, "go.yaml.in/yaml", "gopkg.in/yaml"), "weir/datapath", "weir/balancer")},
	{root: "weir/balancer", deps: append(slices.Clone(forbidden), "weir/datapath")},
	// datapath/... includes the fault injector: it is a Device wrapper like
	// any other and keeps the datapath's rules.
	{root: "weir/datapath", deps: append(slices.Clone(forbidden), "weir/balancer", "weir/bench")},
	// gVisor logs through encoding/json and registers flags of its own;
	// netstack itself uses neither.
	{root: "weir/netstack",
		deps:    []string{"github.com/rs/zerolog", "go.yaml.in/yaml", "gopkg.in/yaml", "weir/cmd", "weir/bench", "weir/datapath/fault"},
		imports: []string{"encoding/json", "flag"}},
	// What happens to an accepted connection (netstack/proxy and below)
	// is plain Go over net.Conn-like interfaces: no gVisor (so not
	// netstack itself, which imports it), and none of the control plane's
	// logging, file formats, flags or packages.
	{root: "weir/netstack/proxy", deps: append(without(forbidden, "weir/netstack"), "weir/bench", "weir/datapath/fault")},
	// The request-by-request HTTP proxy is under that rule already; named
	// on its own so that moving it out from under netstack/proxy fails
	// here ("matches no package") instead of leaving it unchecked.
	{root: "weir/netstack/proxy/http", deps: append(without(forbidden, "weir/netstack"), "weir/bench", "weir/datapath/fault")},
	// The ClientHello reader (SNI routing) reads bytes off any io.Reader:
	// named on its own, like http, and kept free of the proxy itself so
	// that a parser change cannot reach the splice.
	{root: "weir/netstack/proxy/tlshello", deps: append(slices.Clone(forbidden), "weir/policy", "weir/bench", "weir/datapath/fault")},
	// The udp session relay likewise (its gVisor side, the VIP sockets and
	// the back arm's target sockets, is weir/netstack's udp.go).
	{root: "weir/netstack/proxy/udp", deps: append(without(forbidden, "weir/netstack"), "weir/bench", "weir/datapath/fault")},
	// The harness drives weir through public APIs only.
	{root: "weir/bench", deps: []string{"github.com/rs/zerolog", "go.yaml.in/yaml", "gopkg.in/yaml", "flag", "gvisor.dev/gvisor", "weir/cmd", "weir/netstack", "weir/vmtest", "weir/internal"},
		except: []string{"weir/bench/cmd"}}, // programs: checked on their own below
	// The side-by-side harness (bench/cmd/weirbench) is a program that runs
	// the built binary: it has flags and makes its namespaces the project's
	// one way (internal/netns), but links none of weir's insides.
	{root: "weir/bench/cmd", deps: []string{"github.com/rs/zerolog", "go.yaml.in/yaml", "gopkg.in/yaml", "gvisor.dev/gvisor", "weir/cmd", "weir/netstack", "weir/vmtest", "weir/internal/testutil", "weir/datapath", "weir/balancer", "weir/policy"}},
	// The host plumbing decides and applies process settings: no flags
	// (the command tree has them), no logs, none of the appliance.
	{root: "weir/cmd/weir/internal/host", deps: []string{"gvisor.dev/gvisor", "weir/netstack", "weir/cmd/weir/internal/appliance", "github.com/rs/zerolog", "github.com/spf13"}},
	// The VM harness runs the built binary; it links none of weir's insides.
	{root: "weir/vmtest", deps: []string{"gvisor.dev/gvisor", "weir/netstack", "weir/datapath", "weir/balancer", "weir/bench", "weir/cmd/weir/internal"}},
}

func TestImportRules(t *testing.T) {
	g := importGraph(t)
	for _, r := range depRules {
		matched := 0
		for _, pkg := range g.weir {
			if !under(pkg, r.root) || slices.ContainsFunc(r.except, func(e string) bool { return under(pkg, e) }) {
				continue
			}
			matched++
			for _, dep := range g.deps(pkg, nil) {
				if matchesAny(dep, r.deps) {
					t.Errorf("%s depends on %s (via %s), which the design forbids", pkg, dep, strings.Join(g.path(pkg, dep, nil), " → "))
				}
			}
			for _, imp := range g.imports[pkg] {
				if matchesAny(imp, r.imports) {
					t.Errorf("%s imports %s, which the design forbids", pkg, imp)
				}
			}
		}
		if matched == 0 {
			t.Errorf("rule for %s matches no package: renamed?", r.root)
		}
	}
}

// heavyInit are packages whose init costs every weir run resident memory
// whether it uses them or not: gopacket/layers fills some 7 MiB of lookup
// tables (RssAnon 7.6 against 0.6 MiB for a program that imports only it).
// Tests may use them.
var heavyInit = []string{"github.com/google/gopacket"}

// TestBinaryHasNoHeavyInit: the weir binary links none of heavyInit.
func TestBinaryHasNoHeavyInit(t *testing.T) {
	g := importGraph(t)
	for _, dep := range g.deps("weir/cmd/weir", nil) {
		if matchesAny(dep, heavyInit) {
			t.Errorf("weir/cmd/weir depends on %s (via %s), whose init holds megabytes in every run", dep, strings.Join(g.path("weir/cmd/weir", dep, nil), " → "))
		}
	}
}

// TestProductIsFreeOfTheTestLab: no product package reaches bench,
// datapath/fault or testutil except through the lab or the demo, and none
// but cmd/weir (whose `weir demo` is the demo) reaches the lab or the demo.
func TestProductIsFreeOfTheTestLab(t *testing.T) {
	g := importGraph(t)
	stop := []string{"weir/cmd/weir/internal/lab", "weir/cmd/weir/internal/demo"}
	products := 0
	for _, pkg := range g.weir {
		if matchesAny(pkg, testLab) || isDoubles(pkg) {
			continue
		}
		products++
		for _, dep := range g.deps(pkg, stop) {
			if matchesAny(dep, labOnly) || isDoubles(dep) {
				t.Errorf("product package %s depends on %s (via %s), which only tests and the lab may use",
					pkg, dep, strings.Join(g.path(pkg, dep, stop), " → "))
			}
			if matchesAny(dep, stop) && pkg != "weir/cmd/weir" {
				t.Errorf("product package %s depends on %s (via %s); only the binary's `weir demo` may",
					pkg, dep, strings.Join(g.path(pkg, dep, stop), " → "))
			}
		}
	}
	// The appliance is the package the rule was written for: it imported
	// the lab's rig once.
	if !slices.Contains(g.weir, "weir/cmd/weir/internal/appliance") || products < 10 {
		t.Fatalf("only %d product packages found (%v): is the graph right?", products, g.weir)
	}
}

// isDoubles reports whether pkg is a test-double package (<pkg>test, by the
// house convention), which only _test files import.
func isDoubles(pkg string) bool {
	name := pkg[strings.LastIndex(pkg, "/")+1:]
	return strings.HasPrefix(pkg, "weir/") && strings.HasSuffix(name, "test") && name != "vmtest"
}

type graph struct {
	weir    []string            // weir's own packages, sorted
	imports map[string][]string // package → its direct non-test imports
}

// importGraph lists weir's packages and everything they depend on, with
// each one's imports, in one go list run.
func importGraph(t *testing.T) *graph {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", "weir/...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	g := &graph{imports: map[string][]string{}}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		g.imports[f[0]] = f[1:]
		if under(f[0], "weir") {
			g.weir = append(g.weir, f[0])
		}
	}
	sort.Strings(g.weir)
	return g
}

// deps returns every package pkg depends on, directly or not, without
// looking through the packages in stop (they are listed, their own
// dependencies are not).
func (g *graph) deps(pkg string, stop []string) []string {
	seen := map[string]bool{}
	var walk func(string)
	walk = func(p string) {
		for _, d := range g.imports[p] {
			if seen[d] {
				continue
			}
			seen[d] = true
			if !matchesAny(d, stop) {
				walk(d)
			}
		}
	}
	walk(pkg)
	out := make([]string, 0, len(seen))
	for d := range seen {
		out = append(out, d)
	}
	sort.Strings(out)
	return out
}

// path returns a shortest import chain from pkg to dep, for the message.
func (g *graph) path(pkg, dep string, stop []string) []string {
	prev := map[string]string{pkg: ""}
	queue := []string{pkg}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		if p == dep {
			var chain []string
			for ; p != ""; p = prev[p] {
				chain = append(chain, p)
			}
			slices.Reverse(chain)
			return chain
		}
		if p != pkg && matchesAny(p, stop) {
			continue
		}
		for _, d := range g.imports[p] {
			if _, ok := prev[d]; !ok {
				prev[d] = p
				queue = append(queue, d)
			}
		}
	}
	return []string{pkg, "?", dep}
}

// under reports whether pkg is root or inside it.
func under(pkg, root string) bool { return pkg == root || strings.HasPrefix(pkg, root+"/") }

func matchesAny(pkg string, roots []string) bool {
	return slices.ContainsFunc(roots, func(r string) bool { return under(pkg, r) })
}

func without(list []string, drop ...string) []string {
	return slices.DeleteFunc(slices.Clone(list), func(s string) bool { return slices.Contains(drop, s) })
}
