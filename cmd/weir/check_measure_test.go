package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCheckWarnsUnmonitored: with the monitor on and scope policy, a
// service no rule covers gets a warning that says how to change it; a
// covered one, scope all or the monitor off get none.
func TestCheckWarnsUnmonitored(t *testing.T) {
	const services = `services:
  - {name: web, vips: [198.18.0.10], port: 80, protocol: http, targets: [{address: "198.18.1.1:8081"}]}
  - {name: db, vips: [198.18.0.11], port: 5432, targets: [{address: "198.18.1.2:5432"}]}
actions: [{name: gold, outgoingTOS: "10100000"}]
rules: [{name: web, protocol: 6, sourcePorts: 80, action: gold}]
`
	for _, tc := range []struct {
		name, monitor string
		warned        []string
	}{
		{"scope policy", "monitor: {samplingInterval: 10s}\n", []string{"db"}},
		{"scope all", "monitor: {scope: all}\n", nil},
		{"monitor off", "monitor: {enabled: false}\n", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "w.yaml")
			if err := os.WriteFile(path, []byte(services+tc.monitor), 0o644); err != nil {
				t.Fatal(err)
			}
			code, out, errs := run("check", "-c", path)
			if code != 0 {
				t.Fatalf("exit %d: %s", code, errs)
			}
			for _, svc := range []string{"web", "db"} {
				warned := strings.Contains(out, "no policy rule covers service "+svc)
				want := false
				for _, w := range tc.warned {
					want = want || w == svc
				}
				if warned != want {
					t.Errorf("service %s warned %v, want %v:\n%s", svc, warned, want, out)
				}
			}
			if len(tc.warned) > 0 && !strings.Contains(out, "monitor.scope: all") {
				t.Errorf("the warning does not say how to change it:\n%s", out)
			}
		})
	}
}
