package main

import (
	"context"
	"encoding/json"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"weir/cmd/weir/api"
)

func TestParseStat(t *testing.T) {
	// A command name with spaces and parentheses, as a process may choose.
	line := "4242 (a) b (c)) S 1 4240 4240 0 -1 4194560 100 0 0 0 731 52 0 0 20 0 9 0 1234 0 0\n"
	st, err := parseStat(line)
	if err != nil {
		t.Fatal(err)
	}
	if st.pgrp != 4240 || st.utime != 731 || st.stime != 52 {
		t.Fatalf("got %+v, want pgrp 4240 utime 731 stime 52", st)
	}
	for _, bad := range []string{"", "1 (x S 1 2", "1 (x) S 1 2 3"} {
		if _, err := parseStat(bad); err == nil {
			t.Errorf("parseStat(%q): no error", bad)
		}
	}
}

func TestParseHWM(t *testing.T) {
	got, err := parseHWM("Name:\tweir\nVmPeak:\t 9000 kB\nVmHWM:\t   403456 kB\nVmRSS:\t 1000 kB\n")
	if err != nil || got != 403456<<10 {
		t.Fatalf("got %d, %v; want %d", got, err, 403456<<10)
	}
	if _, err := parseHWM("Name:\tx\n"); err == nil {
		t.Error("no VmHWM: no error")
	}
}

// TestGroupUsageSelf reads this test's own process group: the CPU it has
// burnt so far and a resident peak, and clear_refs brings the peak down to
// the current RSS.
func TestGroupUsageSelf(t *testing.T) {
	ballast := make([]byte, 64<<20)
	for i := range ballast {
		ballast[i] = 1
	}
	end := time.Now().Add(50 * time.Millisecond)
	for time.Now().Before(end) {
	}
	pgid := syscall.Getpgrp()
	u, err := groupUsage(pgid)
	if err != nil {
		t.Fatal(err)
	}
	if u.CPUSec <= 0 || u.PeakRSS < 64<<20 {
		t.Fatalf("usage %+v: want CPU > 0 and a peak RSS >= 64 MiB", u)
	}
	runtime.KeepAlive(ballast)
	if hwm, err := vmHWM(os.Getpid()); err != nil || hwm < 64<<20 {
		t.Fatalf("VmHWM %d, %v", hwm, err)
	}
}

func TestPercentile(t *testing.T) {
	var ds []time.Duration
	for i := 100; i >= 1; i-- {
		ds = append(ds, time.Duration(i)*time.Millisecond)
	}
	if p := percentile(ds, 50); p != 50*time.Millisecond {
		t.Errorf("p50 = %v", p)
	}
	if p := percentile(ds, 99); p != 99*time.Millisecond {
		t.Errorf("p99 = %v", p)
	}
	if p := percentile([]time.Duration{7}, 99); p != 7 {
		t.Errorf("p99 of one = %v", p)
	}
	if p := percentile(nil, 50); p != 0 {
		t.Errorf("p50 of none = %v", p)
	}
}

func TestStatOf(t *testing.T) {
	for _, c := range []struct {
		in   []float64
		want stat
	}{
		{[]float64{3, 1, 2}, stat{Median: 2, Min: 1, Max: 3, N: 3}},
		{[]float64{4, 1, 2, 3}, stat{Median: 2.5, Min: 1, Max: 4, N: 4}},
		{nil, stat{}},
	} {
		if got := statOf(c.in); got != c.want {
			t.Errorf("statOf(%v) = %+v, want %+v", c.in, got, c.want)
		}
	}
}

func TestParseIperf(t *testing.T) {
	gbps, bytes, err := parseIperf([]byte(`{"start":{},"end":{"sum_sent":{"bytes":5e9},"sum_received":{"bytes":4125000000,"bits_per_second":3.3e10}}}`))
	if err != nil || gbps != 33 || bytes != 4125000000 {
		t.Fatalf("got %v Gbit/s, %d bytes, %v", gbps, bytes, err)
	}
	if _, _, err := parseIperf([]byte(`{"error":"the server is busy running a test. try again later"}`)); err == nil || !strings.Contains(err.Error(), "busy") {
		t.Errorf("busy: %v", err)
	}
	if _, _, err := parseIperf([]byte(`not json`)); err == nil {
		t.Error("not JSON: no error")
	}
}

// TestConnRateLoopback runs the connection-rate client against its server
// on loopback in both close orders: every connection completes, and a port
// nobody listens on counts errors instead.
func TestConnRateLoopback(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- serveRR(ln) }()
	defer func() { ln.Close(); <-done }()
	for _, sc := range []bool{false, true} {
		start := time.Now()
		r := runConnRate(context.Background(), connRateOptions{Addr: ln.Addr().String(), Clients: 4, Duration: 200 * time.Millisecond, ServerClose: sc})
		if el := time.Since(start); el > 5*time.Second {
			t.Fatalf("server close %v: ran %v past its 200 ms bound", sc, el)
		}
		if r.Conns < 10 || r.Errors != 0 || r.PerSec <= 0 || r.ConnectP50 <= 0 || r.ConnectP99 < r.ConnectP50 || r.TxnP99 < r.TxnP50 || r.TxnP50 <= 0 {
			t.Fatalf("server close %v: %+v", sc, r)
		}
	}
	dead, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := dead.Addr().String()
	dead.Close()
	r := runConnRate(context.Background(), connRateOptions{Addr: addr, Clients: 2, Duration: 50 * time.Millisecond})
	if r.Conns != 0 || r.Errors == 0 || len(r.ErrorTexts) == 0 || !strings.Contains(r.ErrorTexts[0], "connect") {
		t.Fatalf("refused port: %+v", r)
	}
}

// TestSummaryAndMarkdown: medians, spread, ratios to the kernel, CPU per GB
// and per connection, and the tables that show them.
func TestSummaryAndMarkdown(t *testing.T) {
	r := &report{Date: "2026-12-01T00:00:00Z", Machine: "m", Note: "machine not quiet", Reps: 3, IperfSec: 10, ConnSec: 10,
		WeirEnv: "GOGC=50",
		Paths:   []string{"kernel", "weir"}, Tests: []testDef{testByID(t, "stream1"), testByID(t, "conn16")}}
	for i, v := range []float64{30, 34, 32} {
		r.Samples = append(r.Samples, sample{Test: "stream1", Path: "kernel", Rep: i + 1, Value: v, Bytes: 40e9})
	}
	for i, v := range []float64{2, 1, 3} {
		r.Samples = append(r.Samples, sample{Test: "stream1", Path: "weir", Rep: i + 1, Value: v, Bytes: 2e9, CPUSec: 10, PeakRSS: int64(i+1) << 20})
	}
	for i, v := range []float64{20000, 21000, 22000} {
		r.Samples = append(r.Samples, sample{Test: "conn16", Path: "kernel", Rep: i + 1, Value: v, Conn: &connRateResult{Conns: int(v) * 10, PerSec: v, ConnectP50: 40, ConnectP99: 90, TxnP50: 30, TxnP99: 70}})
	}
	r.Samples = append(r.Samples,
		sample{Test: "conn16", Path: "weir", Rep: 1, Value: 5000, CPUSec: 10, Conn: &connRateResult{Conns: 50000, Errors: 2, PerSec: 5000, ConnectP50: 200, ConnectP99: 900, TxnP50: 100, TxnP99: 400}},
		sample{Test: "conn16", Path: "weir", Rep: 2, Err: "connrate: exit status 1"},
		sample{Test: "conn16", Path: "weir", Rep: 3, Value: 4000, CPUSec: 10, Conn: &connRateResult{Conns: 40000, PerSec: 4000, ConnectP50: 300, ConnectP99: 1000, TxnP50: 120, TxnP99: 500}},
	)
	r.summarize()
	k, w := r.cell("stream1", "kernel"), r.cell("stream1", "weir")
	if k.Value != (stat{Median: 32, Min: 30, Max: 34, N: 3}) || w.Value.Median != 2 || w.Ratio != 2.0/32 {
		t.Fatalf("stream1: kernel %+v, weir %+v", k, w)
	}
	if w.CPUPerGB != 5 || w.PeakRSS != 3<<20 { // 30 CPU s over 6 GB
		t.Errorf("stream1 weir: %.2f s/GB, peak %d", w.CPUPerGB, w.PeakRSS)
	}
	c := r.cell("conn16", "weir")
	if c.Failed != 1 || c.Errors != 2 || c.Value.Median != 4500 || c.Ratio != 4500.0/21000 || c.ConnectP50 != 250 {
		t.Errorf("conn16 weir: %+v", c)
	}
	if c.CPUPerConnU != 20.0/90000*1e6 {
		t.Errorf("conn16 weir CPU per conn %.2f µs", c.CPUPerConnU)
	}
	if len(r.Appliances) != 1 || r.Appliances[0].CPUSec != 50 || r.Appliances[0].PeakRSS != 3<<20 {
		t.Errorf("appliances %+v", r.Appliances)
	}
	md := r.markdown()
	for _, want := range []string{
		"| test | unit | kernel | weir | weir / kernel |",
		"| 1 stream | Gbit/s | 32.00 [30.00–34.00] | 2.00 [1.00–3.00] | 0.06 |",
		"| new conns, c16 | conn/s | 21 000 [20 000–22 000] (0 errors) | 4 500 [4 000–5 000] (2 errors) (1 runs failed) | 0.21 |",
		"| new conns, c16 | 40 / 90 · 30 / 70 | 250 / 950 · 110 / 450 |",
		"| CPU per GB, 1 stream | 5.00 s |",
		"| CPU per connection, new conns, c16 | 222 µs |",
		"| peak RSS (largest of any run) | 3 MiB |",
		"conn16 on weir, rep 2: connrate: exit status 1",
		"machine not quiet",
		"weir's extra environment: `GOGC=50`.",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
}

// TestSmoke runs the whole harness for a moment (root and iperf3 needed):
// the topology, kernel and weir and a peer (a second weir, -peer-weir
// netstack, started through the PEER_CMD contract), every test once, the Markdown and JSON out, nothing left behind.
func TestSmoke(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("skipping: the harness builds network namespaces and runs weir on a TUN: needs root")
	}
	if _, err := exec.LookPath("iperf3"); err != nil {
		t.Skip("skipping: needs iperf3 (bash scripts/bench-deps.sh)")
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		t.Skipf("skipping: needs /dev/net/tun: %v", err)
	}
	_, err := haproxyBin()
	haveHAProxy := err == nil
	if !haveHAProxy {
		t.Log("no haproxy here: the harness runs without its column (bash scripts/bench-deps.sh installs it)")
	}
	dir := t.TempDir()
	bench, weir := filepath.Join(dir, "weirbench"), filepath.Join(dir, "weir")
	for _, b := range [][2]string{{bench, "."}, {weir, "weir/cmd/weir"}} {
		if out, err := exec.Command("go", "build", "-o", b[0], b[1]).CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", b[1], err, out)
		}
	}
	// The peer: weir again (-peer-weir: a PEER_CMD the harness writes),
	// serving the peer's address on the TUN the harness names, its targets
	// dialed through its back arm (via: netstack): the measured path.
	out := filepath.Join(dir, "out")
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bench, "-weir", weir, "-out", out, "-reps", "1", "-iperf-time", "1s", "-conn-time", "300ms", "-pause", "0s", "-idle", "300", "-profile", "conn16", "-kproxy", "-haproxy="+strconv.FormatBool(haveHAProxy),
		"-peer-name", "weir2", "-peer-weir", "netstack")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	start := time.Now()
	b, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("weirbench: %v\n%s", err, b)
	}
	t.Logf("weirbench ran in %v", time.Since(start).Round(time.Millisecond))

	var rep report
	js, err := os.ReadFile(filepath.Join(out, "bench-e2e.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(js, &rep); err != nil {
		t.Fatal(err)
	}
	paths := 4 // kernel, weir, weir2, kproxy
	if haveHAProxy {
		paths++
	}
	if want := len(tests) * paths; len(rep.Samples) != want {
		t.Fatalf("%d samples, want %d", len(rep.Samples), want)
	}
	for _, s := range rep.Samples {
		if s.NA != "" {
			if s.Test != "udp1" || (s.Path != haproxyPath && s.Path != "kproxy") {
				t.Errorf("%s on %s: not applicable (%s)", s.Test, s.Path, s.NA)
			}
			continue
		}
		if s.Test == "udp1" && (s.UDP == nil || s.UDP.Packets == 0 || (s.Path == "weir" && (s.UDP.Sessions != 1 || s.UDP.DatagramsIn == 0))) {
			t.Errorf("udp1 on %s: %+v", s.Path, s.UDP)
		}
		if s.Err != "" || s.Value <= 0 {
			t.Errorf("%s on %s: value %v, error %q", s.Test, s.Path, s.Value, s.Err)
		}
		if s.Conn != nil && (s.Conn.Errors != 0 || s.Conn.Conns == 0) {
			t.Errorf("%s on %s: %+v", s.Test, s.Path, s.Conn)
		}
		if s.Path != "kernel" && s.PeakRSS <= 0 {
			t.Errorf("%s on %s: no peak RSS", s.Test, s.Path)
		}
	}
	for _, a := range rep.Appliances {
		if a.CPUSec <= 0 || a.PeakRSS <= 0 || a.CPUPerGB <= 0 || a.StartRSS <= 0 {
			t.Errorf("appliance %+v", a)
		}
	}
	// The idle measurement: every connection held, each costing weir
	// memory and its splice goroutines.
	if im := rep.Idle; im == nil || im.Conns != 300 || im.Errors != 0 || im.GoKiBPerConn <= 0 || im.GoroutinesPerConn < 1 {
		t.Errorf("idle measurement %+v", im)
	}
	if len(rep.Profiles) != 1 || rep.Profiles[0].Err != "" {
		t.Errorf("profiles %+v", rep.Profiles)
	} else if st, err := os.Stat(rep.Profiles[0].File); err != nil || st.Size() == 0 {
		t.Errorf("profile file: %v", err)
	}
	md, err := os.ReadFile(filepath.Join(out, "bench-e2e.md"))
	header := "| test | unit | kernel | weir | weir / kernel | weir2 | weir2 / kernel | kproxy | kproxy / kernel |"
	if haveHAProxy {
		header = "| test | unit | kernel | haproxy | haproxy / kernel | weir | weir / kernel | weir / haproxy | weir2 | weir2 / kernel | weir2 / haproxy | kproxy | kproxy / kernel | kproxy / haproxy |"
		for _, s := range rep.Summary {
			if s.Path != "kernel" && s.Test != "udp1" && (s.RatioHA <= 0 || s.CPURatioHA <= 0) {
				t.Errorf("%s on %s: no ratio to HAProxy: %+v", s.Test, s.Path, s)
			}
		}
	}
	if err != nil || !strings.Contains(string(md), header) {
		t.Errorf("markdown (%v):\n%s", err, md)
	}
	// Everything the harness started is gone with it.
	if pids, _ := exec.Command("pgrep", "-f", dir).Output(); len(pids) > 0 {
		t.Errorf("processes left behind: %s", pids)
	}
}

// TestHAProxyRatios: with an haproxy path every other appliance's figures
// get a ratio to HAProxy's of the same run: throughput, connection rate,
// CPU per GB and per connection, transaction p99, RSS at start and peak.
func TestHAProxyRatios(t *testing.T) {
	r := &report{Date: "d", Machine: "m", Note: "machine shared", Reps: 1, IperfSec: 1, ConnSec: 1,
		HAProxyVersion: "HAProxy version 2.6.12",
		Paths:          []string{"kernel", "haproxy", "weir"}, Tests: []testDef{testByID(t, "reverse"), testByID(t, "conn16")},
		StartRSS: map[string]int64{"weir": 30 << 20, "haproxy": 15 << 20}}
	r.Samples = []sample{
		{Test: "reverse", Path: "kernel", Rep: 1, Value: 16, Bytes: 20e9},
		{Test: "reverse", Path: "weir", Rep: 1, Value: 3, Bytes: 4e9, CPUSec: 12, PeakRSS: 80 << 20},
		{Test: "reverse", Path: "haproxy", Rep: 1, Value: 6, Bytes: 8e9, CPUSec: 8, PeakRSS: 16 << 20},
		{Test: "conn16", Path: "kernel", Rep: 1, Value: 8000, Conn: &connRateResult{Conns: 8000, TxnP99: 6000}},
		{Test: "conn16", Path: "weir", Rep: 1, Value: 2500, CPUSec: 1, Conn: &connRateResult{Conns: 2500, TxnP99: 12000}},
		{Test: "conn16", Path: "haproxy", Rep: 1, Value: 5000, CPUSec: 0.75, Conn: &connRateResult{Conns: 5000, TxnP99: 6000}},
	}
	r.summarize()
	w := r.cell("reverse", "weir")
	if w.RatioHA != 0.5 || w.CPUPerGB != 3 || w.CPURatioHA != 3 {
		t.Errorf("reverse weir: ratio %v, %v s/GB, CPU ratio %v; want 0.5, 3, 3", w.RatioHA, w.CPUPerGB, w.CPURatioHA)
	}
	if h := r.cell("reverse", "haproxy"); h.RatioHA != 1 || h.CPURatioHA != 1 {
		t.Errorf("haproxy against itself: %+v", h)
	}
	if c := r.cell("conn16", "weir"); c.RatioHA != 0.5 || c.CPUPerConnU != 400 || c.CPURatioHA != 400.0/150 {
		t.Errorf("conn16 weir: %+v", c)
	}
	if k := r.cell("conn16", "kernel"); k.RatioHA != 0 {
		t.Errorf("the kernel has no ratio to HAProxy: %+v", k)
	}
	md := r.markdown()
	for _, want := range []string{
		"| test | unit | kernel | haproxy | haproxy / kernel | weir | weir / kernel | weir / haproxy |",
		"| reverse (server → client) | Gbit/s | 16.00 | 6.00 | 0.38 | 3.00 | 0.19 | 0.50 |",
		"| new conns, c16 | – / – · – / 6 000 | – / – · – / 6 000 | – / – · – / 12 000 | 2.00 |",
		"| CPU per GB, reverse (server → client) | 1.00 s | 3.00 s | 3.00 |",
		"| CPU per connection, new conns, c16 | 150 µs | 400 µs | 2.67 |",
		"| RSS at start (after the probe) | 15 MiB | 30 MiB | 2.00 |",
		"| peak RSS (largest of any run) | 16 MiB | 80 MiB | 5.00 |",
		"HAProxy version 2.6.12",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
}

// testByID is the matrix's test id.
func testByID(t *testing.T, id string) testDef {
	t.Helper()
	for _, d := range tests {
		if d.ID == id {
			return d
		}
	}
	t.Fatalf("no test %q", id)
	return testDef{}
}

func TestParseIperfUDP(t *testing.T) {
	u, err := parseIperfUDP([]byte(`{"start":{"test_start":{"protocol":"UDP"}},"end":{
		"sum_sent":{"bytes":2.5e9,"bits_per_second":2e9,"packets":1726519},
		"sum_received":{"bytes":1.25e9,"bits_per_second":1e9,"jitter_ms":0.02,"lost_packets":863260,"packets":1726519,"lost_percent":50}}}`))
	if err != nil || u.Gbps != 1 || u.SentGbps != 2 || u.Bytes != 1.25e9 || u.Packets != 1726519 || u.Lost != 863260 || u.LostPercent != 50 || u.JitterMs != 0.02 {
		t.Fatalf("got %+v, %v", u, err)
	}
	if _, err := parseIperfUDP([]byte(`{"start":{"test_start":{"protocol":"TCP"}},"end":{"sum_received":{"bytes":1}}}`)); err == nil {
		t.Error("a TCP test read as UDP")
	}
	if _, err := parseIperfUDP([]byte(`{"start":{"test_start":{"protocol":"UDP"}},"end":{"sum_received":{"bytes":0}}}`)); err == nil {
		t.Error("nothing received: no error")
	}
}

func TestSNMPValue(t *testing.T) {
	text := "Ip: Forwarding DefaultTTL\nIp: 1 64\nUdp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors\nUdp: 100 2 7 50 5 0\nUdpLite: InDatagrams RcvbufErrors\nUdpLite: 0 9\n"
	if n, err := snmpValue(text, "Udp", "RcvbufErrors"); err != nil || n != 5 {
		t.Errorf("Udp RcvbufErrors = %d, %v; want 5", n, err)
	}
	if _, err := snmpValue(text, "Udp", "Nope"); err == nil {
		t.Error("a counter that is not there read")
	}
}

// TestWeirSide: one stream is one weir session on one target; a second
// session (a stream balanced per datagram, or split) is an error.
func TestWeirSide(t *testing.T) {
	st := func(created, in, picked uint64) weirStatus {
		var s api.Status
		s.UDP.Created, s.UDP.DatagramsIn = created, in
		s.Services = []api.Service{{Name: "iperf", Targets: []api.Target{{Name: "server", Picked: 99}}},
			{Name: udpService, Targets: []api.Target{{Name: "server", Picked: picked}}}}
		return decodeStatus(t, s)
	}
	var u udpResult
	// The sessions after the stream's end (the server closed its socket
	// on datagrams weir still held) are counted apart.
	if err := u.weirSide(st(3, 10, 3), st(4, 4000, 4), st(9, 5010, 9)); err != nil || u.Sessions != 1 || u.TrailingSessions != 5 || u.DatagramsIn != 5000 || u.Picked["server"] != 1 {
		t.Errorf("one session: %v, %+v", err, u)
	}
	if err := u.weirSide(st(3, 10, 3), st(5, 4000, 5), st(5, 5010, 5)); err == nil || !strings.Contains(err.Error(), "2 weir sessions") {
		t.Errorf("two sessions: %v", err)
	}
}

// decodeStatus is st as weirbench reads it from /status: encoded as weir
// encodes it, decoded into weirStatus.
func decodeStatus(t *testing.T, st api.Status) weirStatus {
	t.Helper()
	b, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	var w weirStatus
	if err := json.Unmarshal(b, &w); err != nil {
		t.Fatal(err)
	}
	return w
}

// TestWeirStatusDecodes: every field weirStatus reads comes through from a
// real api.Status document (a renamed JSON field would read 0).
func TestWeirStatusDecodes(t *testing.T) {
	var st api.Status
	st.UDP = api.UDP{Created: 1, DatagramsIn: 2, DatagramsOut: 3, ReceiveDropped: 4, WriteErrors: 5}
	st.Services = []api.Service{{Name: "s", Targets: []api.Target{{Name: "t", Picked: 6}}}}
	w := decodeStatus(t, st)
	u := w.UDP
	if u.Created != 1 || u.DatagramsIn != 2 || u.DatagramsOut != 3 || u.ReceiveDropped != 4 || u.WriteErrors != 5 ||
		len(w.Services) != 1 || w.Services[0].Name != "s" || len(w.Services[0].Targets) != 1 ||
		w.Services[0].Targets[0].Name != "t" || w.Services[0].Targets[0].Picked != 6 {
		t.Errorf("decoded %+v", w)
	}
}

func TestUDPCheckAt(t *testing.T) {
	for run, want := range map[time.Duration]time.Duration{
		time.Second: 750 * time.Millisecond, 2 * time.Second: 1500 * time.Millisecond,
		5 * time.Second: 4 * time.Second, 10 * time.Second: 9 * time.Second, 500 * time.Millisecond: 750 * time.Millisecond,
	} {
		if got := udpCheckAt(run); got != want {
			t.Errorf("udpCheckAt(%v) = %v, want %v", run, got, want)
		}
	}
}

// TestUDPMarkdown: the UDP row gives the receiver's throughput with its
// loss, ratios to the kernel, and HAProxy's cell says it has no UDP (no
// figure, no ratio, not an error).
func TestUDPMarkdown(t *testing.T) {
	r := &report{Date: "d", Machine: "m", Note: "machine shared", Reps: 2, IperfSec: 5, ConnSec: 1,
		HAProxyVersion: "HAProxy version 2.6.12", UDPRate: "2G", UDPLen: udpLen,
		Paths: []string{"kernel", "haproxy", "weir"}, Tests: []testDef{testByID(t, "udp1")}}
	na := "no UDP: HAProxy balances TCP only"
	r.Samples = []sample{
		{Test: "udp1", Path: "kernel", Rep: 1, Value: 1.6, Bytes: 1e9, UDP: &udpResult{LostPercent: 20, Packets: 1}},
		{Test: "udp1", Path: "kernel", Rep: 2, Value: 1.8, Bytes: 1e9, UDP: &udpResult{LostPercent: 10, Packets: 1}},
		{Test: "udp1", Path: "haproxy", Rep: 1, NA: na},
		{Test: "udp1", Path: "haproxy", Rep: 2, NA: na},
		{Test: "udp1", Path: "weir", Rep: 1, Value: 0.85, Bytes: 5e8, CPUSec: 2, UDP: &udpResult{Gbps: 0.85, SentGbps: 2, LostPercent: 57, Packets: 1000, Lost: 570, Sessions: 1, TrailingSessions: 6,
			ServerRcvbuf: 70, TUNDropped: 400, ReceiveDropped: 100, DatagramsIn: 500}},
		{Test: "udp1", Path: "weir", Rep: 2, Value: 0.95, Bytes: 5e8, CPUSec: 2, UDP: &udpResult{LostPercent: 53, Packets: 1, Sessions: 1}},
	}
	r.summarize()
	w, h := r.cell("udp1", "weir"), r.cell("udp1", "haproxy")
	if math.Abs(w.Value.Median-0.9) > 1e-9 || math.Abs(w.Ratio-0.9/1.7) > 1e-9 || w.LossPct.Median != 55 || w.Sessions != 1 || w.CPUPerGB != 4 || w.RatioHA != 0 {
		t.Errorf("weir: %+v", w)
	}
	if h.NA != na || h.Value.N != 0 || h.Failed != 0 {
		t.Errorf("haproxy: %+v", h)
	}
	md := r.markdown()
	for _, want := range []string{
		"| UDP, 1 stream (iperf3 -u) | Gbit/s | 1.70 [1.60–1.80] (15 % lost) | — (no UDP: HAProxy balances TCP only) | – | 0.90 [0.85–0.95] (55 % lost) | 0.53 | – |",
		"UDP: iperf3 -u, 1 stream, client → server, -b 2G",
		"1448-byte datagrams",
		"| CPU per GB, UDP, 1 stream (iperf3 -u) | – | 4.00 s | – |",
		"- weir rep 1: sent 2.00 Gbit/s (1000 datagrams), received 0.85, lost 570 (57 %), 70 of them at the server's socket buffer; weir: 400 dropped at its TUN queue, 100 at its VIP endpoint's buffer, 500 relayed, 1 session (6 trailing); 2.0 CPU s, 3333.3 µs per datagram it read",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
	if strings.Contains(md, "\nErrors\n") {
		t.Errorf("a not-applicable cell listed as an error:\n%s", md)
	}
}

func TestParseAdminProfiles(t *testing.T) {
	g, err := parseGoroutines([]byte("goroutine profile: total 20017\n1 @ 0x1\n"))
	if err != nil || g != 20017 {
		t.Errorf("parseGoroutines = %d, %v; want 20017", g, err)
	}
	if _, err := parseGoroutines([]byte("nonsense\n")); err == nil {
		t.Error("parseGoroutines accepted a text without the total line")
	}
	heap := "heap profile: 1: 2 [3: 4] @ heap/1048576\n# runtime.MemStats\n# Alloc = 1\n# HeapInuse = 81920\n# Stack = 65536 / 65536\n"
	m, err := parseMemStats([]byte(heap))
	if err != nil || m.HeapInuse != 81920 || m.StackInuse != 65536 {
		t.Errorf("parseMemStats = %+v, %v", m, err)
	}
	if _, err := parseMemStats([]byte("# HeapInuse = 1\n")); err == nil {
		t.Error("parseMemStats accepted a profile without a Stack line")
	}
	if kb, err := statusKB("Name:\tweir\nVmRSS:\t  2048 kB\n", "VmRSS:"); err != nil || kb != 2048<<10 {
		t.Errorf("statusKB = %d, %v", kb, err)
	}
}

func TestSelectTests(t *testing.T) {
	sel, err := selectTests("conn16-sc,stream1")
	if err != nil || len(sel) != 2 || sel[0].ID != "stream1" || sel[1].ID != "conn16-sc" {
		t.Errorf("selectTests = %v, %v; want stream1, conn16-sc in the matrix's order", sel, err)
	}
	if _, err := selectTests("stream9"); err == nil {
		t.Error("selectTests accepted an unknown test")
	}
	if all, _ := selectTests(""); len(all) != len(tests) {
		t.Errorf("selectTests(\"\") = %d tests, want all %d", len(all), len(tests))
	}
}

func TestWeirEnvFlag(t *testing.T) {
	for _, bad := range []string{"GOGC", "=50", "GOGC=50 junk"} {
		err := benchMain([]string{"-weir-env", bad})
		if err == nil || !strings.Contains(err.Error(), "-weir-env") || !strings.Contains(err.Error(), "want NAME=VALUE") {
			t.Errorf("-weir-env %q: %v, want a NAME=VALUE error", bad, err)
		}
	}
}

// TestPeerWeirConfig: each -peer-weir variant serves the peer's address and
// differs from weir's config only in what it names.
func TestPeerWeirConfig(t *testing.T) {
	base := weirConfig()
	for v := range peerWeirVariants {
		cfg := peerWeirConfig(v)
		if strings.Contains(cfg, weirVIP) || strings.Count(cfg, serverPeerIP) != strings.Count(base, weirVIP) {
			t.Errorf("%s: not every VIP moved to %s:\n%s", v, serverPeerIP, cfg)
		}
		if strings.Count(base, serverWeirAddr+":") != 2 || strings.Count(base, serverAddr+":") != 1 {
			t.Errorf("weir: want the 2 tcp targets at %s, the udp one at %s:\n%s", serverWeirAddr, serverAddr, base)
		}
		if strings.Count(cfg, serverAltAddr+":") != 2 || strings.Count(cfg, serverAddr+":") != 1 {
			t.Errorf("%s: want the 2 tcp targets at %s, the udp one at %s:\n%s", v, serverAltAddr, serverAddr, cfg)
		}
		nets, off := strings.Count(cfg, "via: netstack"), strings.Contains(cfg, "hostCapture: off")
		switch {
		case v == "netstack" && nets != 2: // iperf and rr, not the udp service
			t.Errorf("netstack: %d targets via netstack, want the 2 tcp ones:\n%s", nets, cfg)
		case v != "netstack" && nets != 0:
			t.Errorf("%s: %d targets via netstack", v, nets)
		case off != (v == "capture-off"):
			t.Errorf("%s: hostCapture off %v", v, off)
		}
	}
	if err := benchMain([]string{"-peer-weir", "nope"}); err == nil || !strings.Contains(err.Error(), "capture-off") {
		t.Errorf("-peer-weir nope: %v, want an error naming the variants", err)
	}
	if err := benchMain([]string{"-peer-weir", "same", "-peer-cmd", "true"}); err == nil {
		t.Error("-peer-weir with -peer-cmd: no error")
	}
}
