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

// TestCheckSaysMeasurement: weir check says per target and direction how
// it is measured and which direction the monitor reads: the host capture
// for a via: host target by default, TCP_INFO's estimate with
// monitor.hostCapture off (the monitor then reads to_target), the back
// arm for via: netstack; a bad hostCapture value is an error.
func TestCheckSaysMeasurement(t *testing.T) {
	const services = `services:
  - {name: web, vips: [198.18.0.10], port: 80, targets: [{name: a, address: "198.18.1.1:80"}, {name: b, address: "198.18.1.2:80", via: netstack}]}
`
	for _, tc := range []struct {
		name, monitor string
		want          []string
	}{
		{"default", "monitor: {scope: all}\n", []string{
			"web/a via host: from_target measured (host capture), to_target measured (host capture); the monitor reads from_target",
			"web/b via netstack: from_target measured (back arm), to_target measured (back arm); the monitor reads from_target",
			"CAP_NET_RAW"}},
		{"capture off", "monitor: {scope: all, hostCapture: off}\n", []string{
			"monitor.hostCapture off",
			"web/a via host: from_target estimate, to_target measured (kernel); the monitor reads to_target (from_target is an estimate)"}},
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
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
		})
	}
	path := filepath.Join(t.TempDir(), "w.yaml")
	if err := os.WriteFile(path, []byte(services+"monitor: {hostCapture: maybe}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, _, errs := run("check", "-c", path); code != 1 || !strings.Contains(errs, "want on or off") {
		t.Errorf("hostCapture: maybe: exit %d, %s", code, errs)
	}
}
