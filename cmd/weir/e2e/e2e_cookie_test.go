//go:build linux

package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"sort"
	"sync/atomic"
	"testing"
	"time"

	"weir/policy"
)

// phase is one run of sequential requests: latencies and wall time.
type phase struct {
	name  string
	lat   []time.Duration
	total time.Duration
	fails int
}

func (p *phase) pct(q float64) time.Duration {
	if len(p.lat) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), p.lat...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

// TestE2ESYNFloodSequential is issue 23's scenario with a real (kernel)
// client: 200 spoofed SYNs, just enough to fill the VIP's backlog of 64
// half-open handshakes and put it in SYN-cookie mode, then three runs of
// 400 sequential requests, each preceded by 200 more spoofed SYNs so that
// it runs in cookie mode (1 200 connections through cookies on one
// listener: before the fix, each one after about the 400th lost its
// request to the listener and waited for the client's 200 ms RTO: 0.41 s,
// 28.2 s, 38.9 s). Each run's total and p99 must stay within twice the
// no-flood baseline's total (plus 1 s for a loaded machine), at most 1 %
// of requests take 200 ms or more, no listener drop is counted, and after
// a flood the VIP leaves cookie mode within timeouts.handshake. The drop
// needs the client's ACK and request to reach the listener before it has
// processed the ACK; here (a namespace on the same host) that race is
// rarely won, so TestCookieFirstDataSegment in netstack forces it and is
// the regression test; this one gives the figures with the real binary.
func TestE2ESYNFloodSequential(t *testing.T) {
	w := startWeir(t, "flood.yaml")
	var conns atomic.Int64
	w.countingHTTP("198.18.1.1:8080", &conns)
	client := &http.Client{
		Timeout: 5 * time.Second,
		Transport: &http.Transport{
			DisableKeepAlives: true,
			DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				return w.ns.Dial(ctx, network, addr)
			},
		},
	}
	defer client.CloseIdleConnections()
	get := func() (time.Duration, error) {
		t0 := time.Now()
		resp, err := client.Get("http://198.18.0.30/")
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		if _, err := io.ReadAll(resp.Body); err != nil {
			return 0, err
		}
		if resp.StatusCode != 200 {
			return 0, fmt.Errorf("status %d", resp.StatusCode)
		}
		return time.Since(t0), nil
	}
	const requests = 400
	run := func(name string) *phase {
		p := &phase{name: name}
		start := time.Now()
		for i := 0; i < requests; i++ {
			d, err := get()
			if err != nil {
				p.fails++
				t.Logf("%s, request %d: %v", name, i, err)
				continue
			}
			p.lat = append(p.lat, d)
		}
		p.total = time.Since(start)
		return p
	}
	dst := netip.MustParseAddrPort("198.18.0.30:80")
	var sent atomic.Int64
	src := 0
	flood := func() {
		// synFlood numbers its sources from 0; each call floods the same
		// 200, whose half-open entries a fresh SYN of the same 4-tuple
		// does not renew: shift the ports by sending more and more.
		if err := w.synFlood(dst, src+200, &sent); err != nil {
			t.Fatalf("flood: %v", err)
		}
		src += 200
	}
	if _, err := get(); err != nil {
		t.Fatalf("before the flood: %v", err)
	}
	base := run("baseline")
	m0 := w.metrics()
	var phases []*phase
	for i := 1; i <= 3; i++ {
		flood()
		phases = append(phases, run(fmt.Sprintf("flood run %d", i)))
	}
	m1 := w.metrics()
	delta := func(name string, labels map[string]string) float64 {
		return metricSum(m1, name, labels) - metricSum(m0, name, labels)
	}
	cookies := delta("weir_forwarder_syn_cookies_valid_total", nil)
	listenDrops := delta("weir_forwarder_listen_dropped_total", nil)
	for _, p := range append([]*phase{base}, phases...) {
		t.Logf("%-12s %d/%d ok, p50 %v p99 %v max %v, total %v", p.name, len(p.lat), requests,
			p.pct(0.5).Round(10*time.Microsecond), p.pct(0.99).Round(10*time.Microsecond), p.pct(1).Round(10*time.Microsecond), p.total.Round(time.Millisecond))
	}
	t.Logf("%d spoofed SYNs; %d connections through cookies; listener drops %v; flows %v (half-open %v, evicted %v, expired %v, refused %v); uncached %v",
		sent.Load(), int64(cookies), listenDrops,
		metricSum(m1, "weir_datapath_flows", nil), metricSum(m1, "weir_datapath_flows_half_open", nil),
		delta("weir_datapath_flows_evicted_total", nil), delta("weir_datapath_flows_expired_total", nil),
		delta("weir_datapath_flows_refused_total", nil), delta("weir_datapath_uncached_total", nil))
	if cookies < 2*requests {
		t.Errorf("only %d connections through cookies in the three flooded runs: the scenario did not hold the VIP in cookie mode", int64(cookies))
	}
	if listenDrops != 0 {
		t.Errorf("the listener dropped %v segments", listenDrops)
	}
	for _, p := range phases {
		if p.fails > 0 {
			t.Errorf("%s: %d requests failed", p.name, p.fails)
		}
		// The bug's mark: a request that waited for the client's RTO
		// (200 ms). Allow 1 %, for a loaded machine.
		slow := 0
		for _, d := range p.lat {
			if d >= 200*time.Millisecond {
				slow++
			}
		}
		if slow*100 > requests {
			t.Errorf("%s: %d of %d requests took 200 ms or more", p.name, slow, requests)
		}
		// Within twice the baseline, plus a second for a machine shared
		// with other test loads (the bug: 28 s against 0.4 s).
		if p.total > 2*base.total+time.Second {
			t.Errorf("%s took %v, the baseline %v: more than twice", p.name, p.total, base.total)
		}
	}
	// Cookie mode ends within timeouts.handshake of a flood: once out of
	// it (no cookie for a probe connection), flood again, and probe every
	// 100 ms until a connection gets a stateful SYN-ACK again.
	cookieProbe := func() bool {
		before := metricSum(w.metrics(), "weir_forwarder_syn_cookies_sent_total", nil)
		if _, err := get(); err != nil {
			t.Errorf("probe: %v", err)
		}
		return metricSum(w.metrics(), "weir_forwarder_syn_cookies_sent_total", nil) > before
	}
	limit := 4 * policy.DefaultHandshakeTimeout
	for t0 := time.Now(); cookieProbe(); time.Sleep(100 * time.Millisecond) {
		if time.Since(t0) > limit {
			t.Fatalf("still in cookie mode %v after the runs", limit)
		}
	}
	flood()
	lastFlood := time.Now()
	if !cookieProbe() {
		t.Fatalf("200 spoofed SYNs did not put the VIP in cookie mode")
	}
	for cookieProbe() && time.Since(lastFlood) < limit {
		time.Sleep(100 * time.Millisecond)
	}
	out := time.Since(lastFlood)
	t.Logf("out of cookie mode %v after a flood of 200 SYNs (timeouts.handshake %v; gVisor alone: 127 s)", out.Round(10*time.Millisecond), policy.DefaultHandshakeTimeout)
	if out > policy.DefaultHandshakeTimeout+time.Second {
		t.Errorf("the VIP stayed in cookie mode %v after the flood, timeouts.handshake is %v", out, policy.DefaultHandshakeTimeout)
	}
}
