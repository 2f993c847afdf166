package main

import (
	"bytes"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"weir/policy"
)

// run executes a weir command line in-process.
func run(args ...string) (code int, stdout, stderr string) {
	var out, errb bytes.Buffer
	code = execute(args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestCheckSummary(t *testing.T) {
	code, out, errs := run("check", "-c", "../../examples/zos-telnet.pa")
	want := `../../examples/zos-telnet.pa: ok
instance weir: no limits
  bandwidth averaged over 30s, recomputed every 100ms
  timeouts: handshake 5s, connect 3s, firstByte 30s, idle 5m0s, requestRead 2s, inFlightPerVIP 1024
services: none
rules (first match wins):
  1. targetelnet: protocol 6, server port 23 → telnetGold (ToS 0xA0 (10100000), minRate 500 Kbit/s)
monitor: on, sampling every 1m0s
  loss > 2.0 % → 25 %, step, max 95 %
  timeouts > 5.0 % → 50 %, step, max 100 %
  connections at 50 / 65 / 80 % of an action's maxConnections → 50 / 85 / 100 %
balancer: round-robin, a failed target rests 1m0s, 3 attempts, config refresh off
`
	if code != 0 || errs != "" {
		t.Fatalf("exit %d, stderr %q", code, errs)
	}
	if out != want {
		t.Errorf("summary\n got:\n%s\nwant:\n%s", out, want)
	}
}

func TestCheckExamples(t *testing.T) {
	files, err := filepath.Glob("../../examples/*")
	if err != nil || len(files) == 0 {
		t.Fatalf("no examples: %v", err)
	}
	tests := []struct {
		args []string
		want []string // lines the summary must hold
	}{
		{[]string{"check", "-c", "../../examples/websphere-cluster.yaml"}, []string{
			"  wlm-cluster: http 198.18.0.20, fd00::20, port 80, under instance",
			"    target wasmember05 198.18.2.5:9080: weight 2, maxConnections 3, primary, via host",
			"    target wasmember06 198.18.2.6:9080: weight 2, maxConnections 4, primary, via host",
			"    target wasbackup [fd00::2:7]:9080: weight 1, maxConnections 10, backup, via host",
		}},
		{[]string{"check", "../../examples/sun-qos.yaml"}, []string{
			"instance sun-qos: bandwidth 10000000 B/s enforced; connections 1000 log only",
			"  isp-basic (under instance): bandwidth 1000000 B/s enforced; connections 200 enforced",
			"    limits: bandwidth 100000 B/s enforced, burst 65536 B; connections 50 enforced",
		}},
		{append([]string{"check"}, files...), []string{
			"../../examples/zos-telnet.yaml: ok",
			"    target sys1 198.18.3.1:23: weight 40, no connection limit, primary, via host",
		}},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			code, out, errs := run(tt.args...)
			if code != 0 || errs != "" {
				t.Fatalf("exit %d, stderr %q", code, errs)
			}
			lines := map[string]bool{}
			for _, l := range strings.Split(out, "\n") {
				lines[l] = true
			}
			for _, w := range tt.want {
				if !lines[w] {
					t.Errorf("summary lacks %q:\n%s", w, out)
				}
			}
		})
	}
}

func TestCheckErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("instance:\n  limits: {maxConnections: many}\nrules: [{name: r, action: none}]\nbogus: 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	good := "../../examples/websphere-cluster.yaml"
	tests := []struct {
		name       string
		args       []string
		code       int
		wantErr    string
		wantOutPfx string
	}{
		{"every error with its position", []string{"check", "-c", bad}, 1,
			bad + ":2:28: maxConnections: want an integer, got \"many\"\n" +
				bad + ":3:27: rule \"r\" names unknown action \"none\"\n" +
				bad + ":4:1: unknown key \"bogus\" in config\n" +
				"weir check: 1 of 1 config files have errors\n", ""},
		{"good and bad together", []string{"check", "-c", good, "-c", bad}, 1,
			bad + ":2:28: maxConnections: want an integer, got \"many\"\n" +
				bad + ":3:27: rule \"r\" names unknown action \"none\"\n" +
				bad + ":4:1: unknown key \"bogus\" in config\n" +
				"weir check: 1 of 2 config files have errors\n", good + ": ok\n"},
		{"missing file", []string{"check", "-c", filepath.Join(dir, "none.yaml")}, 1,
			"config: open " + filepath.Join(dir, "none.yaml") + ": no such file or directory\n" +
				"weir check: 1 of 1 config files have errors\n", ""},
		{"no file", []string{"check"}, 1,
			"weir: check: no config file (give -c FILE)\nRun 'weir --help' for usage.\n", ""},
		{"unknown flag", []string{"check", "--bogus"}, 1,
			"weir: unknown flag: --bogus\nRun 'weir --help' for usage.\n", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out, errs := run(tt.args...)
			if code != tt.code {
				t.Errorf("exit %d, want %d", code, tt.code)
			}
			if errs != tt.wantErr {
				t.Errorf("stderr\n got:\n%s\nwant:\n%s", errs, tt.wantErr)
			}
			if !strings.HasPrefix(out, tt.wantOutPfx) || (tt.wantOutPfx == "" && out != "") {
				t.Errorf("stdout = %q, want it to start with %q", out, tt.wantOutPfx)
			}
		})
	}
}

func TestVersion(t *testing.T) {
	for _, args := range [][]string{{"version"}, {"--version"}} {
		code, out, errs := run(args...)
		if code != 0 || out != "weir "+version+"\n" || errs != "" {
			t.Errorf("%v: exit %d, stdout %q, stderr %q", args, code, out, errs)
		}
	}
}

// TestWriteSummary covers what the examples do not: nested classes, port
// ranges, rules with every condition, a disabled monitor, health checks.
func TestWriteSummary(t *testing.T) {
	top := &policy.Class{Name: "top"}
	gold := &policy.Class{Name: "gold", Parent: top, Limits: policy.Limits{MaxConnections: 5}}
	vs := &policy.VirtualServer{
		Name: "web", Class: gold, VIPs: []netip.Addr{netip.MustParseAddr("fd00::1")},
		Ports: policy.PortRange{Lo: 8000, Hi: 8010}, Proto: policy.ProtoTCP,
		Timeouts: policy.Timeouts{FirstByte: -1, Connect: time.Second},
		Targets: []*policy.Target{{Name: "n", Addr: netip.MustParseAddrPort("[fd00::2]:80"), Via: policy.DialNetstack},
			{Addr: netip.MustParseAddrPort("[fd00::3]:0")}},
	}
	act := &policy.Action{Name: "a", MeanRate: 2000, MaxConnections: 9}
	c := &policy.Config{
		Classes:  []*policy.Class{top, gold},
		Services: []*policy.VirtualServer{vs},
		Actions:  []*policy.Action{act, {Name: "plain"}},
		Rules: []*policy.Rule{
			{Name: "r", ProtoLo: 6, ProtoHi: 17, SrcPort: policy.PortRange{Lo: 80, Hi: 80}, DstPort: policy.PortRange{Lo: 1024, Hi: 2048},
				Src: netip.MustParsePrefix("fd00::/64"), Dst: netip.MustParsePrefix("198.18.0.0/15"), Service: vs, Action: act},
		},
		Balancer: policy.BalancerSettings{Algorithm: policy.LeastConn, SlowStart: 10 * time.Second,
			Health: policy.HealthCheck{Interval: 4 * time.Second}},
	}
	c.Rules = append(c.Rules, &policy.Rule{Name: "all", Action: c.Actions[1]})
	if _, err := policy.Compile(c); err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := writeSummary(&b, c); err != nil {
		t.Fatal(err)
	}
	want := `instance weir: no limits
  bandwidth averaged over 30s, recomputed every 100ms
  timeouts: handshake 5s, connect 3s, firstByte 30s, idle 5m0s, requestRead 2s, inFlightPerVIP 1024
classes:
  top (under instance): no limits
  gold (under class top): connections 5 log only
services:
  web: tcp fd00::1, port 8000-8010, under class gold
    limits: no limits
    timeouts: handshake 5s, connect 1s, firstByte off, idle 5m0s, requestRead 2s, inFlightPerVIP 1024
    target n [fd00::2]:80: weight 0, no connection limit, primary, via netstack
    target fd00::3: weight 0, no connection limit, primary, via host
      keeps the client's port: a connection to port p of 8000-8010 goes to fd00::3 port p (health checks: port 8000)
rules (first match wins):
  1. r: protocol 6-17, server fd00::/64, server port 80, client 198.18.0.0/15, client port 1024-2048, service web → a (meanRate 2000 Kbit/s, maxConnections 9)
  2. all: any flow → plain
monitor: off
balancer: least-conn, a failed target rests 1m0s, 3 attempts, config refresh off
  health checks every 4s, timeout 2s, up after 2, down after 3
  slow start over 10s
`
	if b.String() != want {
		t.Errorf("summary\n got:\n%s\nwant:\n%s", b.String(), want)
	}
}
