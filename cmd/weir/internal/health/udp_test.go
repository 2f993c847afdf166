package health

import (
	"bytes"
	"context"
	"encoding/binary"
	"net"
	"net/netip"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"weir/balancer"
	"weir/policy"
)

// udpServer is a real UDP server on loopback: each datagram it reads gets
// the replies its answer function returns now (none: silent). It keeps the
// datagrams it read.
type udpServer struct {
	c      *net.UDPConn
	answer atomic.Pointer[func(q []byte) [][]byte]
	mu     sync.Mutex
	got    [][]byte
}

func newUDPServer(t *testing.T, answer func(q []byte) [][]byte) *udpServer {
	t.Helper()
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	s := &udpServer{c: c}
	s.set(answer)
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 65535)
		for {
			n, from, err := c.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			q := bytes.Clone(buf[:n])
			s.mu.Lock()
			s.got = append(s.got, q)
			s.mu.Unlock()
			for _, r := range (*s.answer.Load())(q) {
				c.WriteToUDPAddrPort(r, from)
			}
		}
	}()
	t.Cleanup(func() { c.Close(); <-done })
	return s
}

func (s *udpServer) set(answer func(q []byte) [][]byte) { s.answer.Store(&answer) }

func (s *udpServer) addr() netip.AddrPort { return s.c.LocalAddr().(*net.UDPAddr).AddrPort() }

func (s *udpServer) queries() [][]byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([][]byte(nil), s.got...)
}

// dnsReply answers a DNS query as a server would: its ID (xor flip) with
// QR set and rcode, the question echoed.
func dnsReply(q []byte, flip uint16, rcode byte) []byte {
	if len(q) < 12 {
		return nil
	}
	r := bytes.Clone(q)
	binary.BigEndian.PutUint16(r, binary.BigEndian.Uint16(q)^flip)
	r[2] |= 0x80 // QR
	r[3] = 0x80 | rcode
	return r
}

// The answer functions of the tests' servers.
var (
	dnsOK      = func(q []byte) [][]byte { return [][]byte{dnsReply(q, 0, 0)} }
	dnsNX      = func(q []byte) [][]byte { return [][]byte{dnsReply(q, 0, 3)} }
	dnsWrongID = func(q []byte) [][]byte { return [][]byte{dnsReply(q, 0x0101, 0)} }
	dnsLateOK  = func(q []byte) [][]byte { return [][]byte{dnsReply(q, 0x0101, 0), q, dnsReply(q, 0, 0)} }
	echo       = func(q []byte) [][]byte { return [][]byte{q} }
	silentUDP  = func([]byte) [][]byte { return nil }
	pong       = func(q []byte) [][]byte {
		if string(q) == "PING\n" {
			return [][]byte{[]byte("PONG 1\n")}
		}
		return [][]byte{[]byte("ERR\n")}
	}
)

// closedUDP returns a loopback UDP address nothing is bound to: a datagram
// there gets ICMP port unreachable (not rate limited on loopback).
func closedUDP(t *testing.T) netip.AddrPort {
	t.Helper()
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	a := c.LocalAddr().(*net.UDPAddr).AddrPort()
	c.Close()
	return a
}

// compiledUDP compiles a udp service whose check is x, so the probe gets
// Compile's defaults (the DNS type).
func compiledUDP(t *testing.T, x *policy.UDPCheck, timeout time.Duration) *policy.HealthCheck {
	t.Helper()
	cfg, err := policy.Compile(&policy.Config{Services: []*policy.VirtualServer{{Name: "dns", Proto: policy.ProtoUDP,
		VIPs: []netip.Addr{netip.MustParseAddr("192.0.2.53")}, Ports: policy.PortRange{Lo: 53, Hi: 53},
		Health:  &policy.HealthCheck{Interval: 10 * timeout, Timeout: timeout, UDP: x},
		Targets: []*policy.Target{{Name: "a", Addr: netip.MustParseAddrPort("192.0.2.1:53"), Weight: 1}}}}})
	if err != nil {
		t.Fatal(err)
	}
	return cfg.Services[0].Health
}

// TestUDPCheckReasons: the udp probe against real loopback servers: a DNS
// server answering the query's ID passes; a wrong ID, the query echoed
// back (QR clear) and silence fail at the timeout, the first two naming
// the replies ignored; a right answer after ignored ones passes; the
// answer's rcode is judged at once; a closed port (ICMP port unreachable)
// fails refused at once; the text, hex and regexp forms judge the reply's
// bytes.
func TestUDPCheckReasons(t *testing.T) {
	const timeout = 500 * time.Millisecond // the quick verdicts come well within it on a loaded machine
	dns := &policy.UDPCheck{DNS: &policy.DNSCheck{Name: "who.test"}}
	anyRCode := &policy.UDPCheck{DNS: &policy.DNSCheck{Name: "who.test", RCode: policy.AnyRCode}}
	nxdomain := &policy.UDPCheck{DNS: &policy.DNSCheck{Name: "nope.test", RCode: 3}}
	ping := func(expect string) *policy.UDPCheck {
		return &policy.UDPCheck{Send: []byte("PING\n"), Expect: []byte(expect)}
	}
	tests := []struct {
		name   string
		addr   netip.AddrPort
		x      *policy.UDPCheck
		ok     bool
		reason string // a prefix
		late   bool   // the verdict comes at the timeout
	}{
		{"dns answer", newUDPServer(t, dnsOK).addr(), dns, true, "", false},
		{"dns wrong ID", newUDPServer(t, dnsWrongID).addr(), dns, false, ReasonMismatch + ": 1 reply ignored, last: DNS ID 0x", true},
		{"dns echo", newUDPServer(t, echo).addr(), dns, false, ReasonMismatch + ": 1 reply ignored, last: DNS QR bit clear", true},
		{"dns right after wrong", newUDPServer(t, dnsLateOK).addr(), dns, true, "", false},
		{"dns silent", newUDPServer(t, silentUDP).addr(), dns, false, ReasonTimeout, true},
		{"dns nxdomain", newUDPServer(t, dnsNX).addr(), dns, false, "DNS rcode NXDOMAIN, want NOERROR", false},
		{"dns nxdomain wanted", newUDPServer(t, dnsNX).addr(), nxdomain, true, "", false},
		{"dns any rcode", newUDPServer(t, dnsNX).addr(), anyRCode, true, "", false},
		{"dns closed port", closedUDP(t), dns, false, ReasonRefused, false},
		{"text closed port", closedUDP(t), ping("PONG"), false, ReasonRefused, false},
		{"text", newUDPServer(t, pong).addr(), ping("PONG"), true, "", false},
		{"text any reply", newUDPServer(t, pong).addr(), &policy.UDPCheck{Send: []byte("x")}, true, "", false},
		{"text mismatch", newUDPServer(t, pong).addr(), ping("PANG"), false, ReasonMismatch + ": 1 reply ignored, last: 7 bytes 504f4e4720310a not beginning with expect", true},
		{"hex", newUDPServer(t, pong).addr(), &policy.UDPCheck{Send: []byte("PING\n"), Expect: []byte{'P', 'O'}}, true, "", false},
		{"regexp", newUDPServer(t, pong).addr(), &policy.UDPCheck{Send: []byte("PING\n"), ExpectRegexp: regexp.MustCompile(`^PONG \d`)}, true, "", false},
		{"regexp mismatch", newUDPServer(t, pong).addr(), &policy.UDPCheck{Send: []byte("PINGX"), ExpectRegexp: regexp.MustCompile(`^PONG`)}, false, ReasonMismatch + ": 1 reply ignored, last: 4 bytes 4552520a not matching", true},
		{"text silent", newUDPServer(t, silentUDP).addr(), ping("PONG"), false, ReasonTimeout, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := compiledUDP(t, tt.x, timeout)
			start := time.Now()
			r := Check(context.Background(), Target{Name: "a", Addr: tt.addr}, h)
			took := time.Since(start)
			if r.OK != tt.ok || !strings.HasPrefix(r.Reason, tt.reason) || tt.reason == "" && r.Reason != "" {
				t.Errorf("Check = %+v, want ok %v reason %q…", r, tt.ok, tt.reason)
			}
			if tt.late && took < timeout {
				t.Errorf("verdict after %v, before the timeout %v", took, timeout)
			}
			if !tt.late && took >= timeout {
				t.Errorf("verdict after %v: waited for the timeout %v", took, timeout)
			}
		})
	}
}

// TestDNSQueryWire: the query is RFC 1035's standard query: the ID, RD,
// one question of class IN; each probe draws a fresh ID.
func TestDNSQueryWire(t *testing.T) {
	got := appendDNSQuery(nil, &policy.DNSCheck{Name: "who.test", Type: 28}, 0x5a5b)
	want := []byte{0x5a, 0x5b, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0, 3, 'w', 'h', 'o', 4, 't', 'e', 's', 't', 0, 0, 28, 0, 1}
	if !bytes.Equal(got, want) {
		t.Errorf("query %x, want %x", got, want)
	}
	if root := appendDNSQuery(nil, &policy.DNSCheck{Name: ".", Type: 2}, 1); !bytes.Equal(root[12:], []byte{0, 0, 2, 0, 1}) {
		t.Errorf("root query's question %x", root[12:])
	}

	srv := newUDPServer(t, dnsOK)
	h := compiledUDP(t, &policy.UDPCheck{DNS: &policy.DNSCheck{Name: "who.test"}}, time.Second)
	const probes = 20
	for range probes {
		if r := Check(context.Background(), Target{Name: "a", Addr: srv.addr()}, h); !r.OK {
			t.Fatalf("probe: %+v", r)
		}
	}
	ids := map[uint16]bool{}
	for _, q := range srv.queries() {
		if len(q) != 26 || !bytes.Equal(q[2:22], want[2:22]) || !bytes.Equal(q[22:], []byte{0, 1, 0, 1}) { // type A (Compile's default), class IN
			t.Errorf("query %x", q)
		}
		ids[binary.BigEndian.Uint16(q)] = true
	}
	if len(ids) < probes-2 {
		t.Errorf("%d probes used %d distinct IDs", probes, len(ids))
	}
}

// TestUDPCheckerMarksDownAndUp: a udp service's checks, as the appliance
// wires them, take a DNS target that goes silent out of the balancer's
// picks after fall rounds and back after rise rounds of answers; a closed
// port is down after fall rounds of refused.
func TestUDPCheckerMarksDownAndUp(t *testing.T) {
	srv := newUDPServer(t, dnsOK)
	vs := &policy.VirtualServer{Name: "dns", Proto: policy.ProtoUDP,
		VIPs: []netip.Addr{netip.MustParseAddr("192.0.2.53")}, Ports: policy.PortRange{Lo: 53, Hi: 53},
		Health: &policy.HealthCheck{Interval: time.Second, Timeout: 200 * time.Millisecond, Rise: 2, Fall: 3,
			UDP: &policy.UDPCheck{DNS: &policy.DNSCheck{Name: "who.test"}}},
		Targets: []*policy.Target{{Name: "a", Addr: srv.addr(), Weight: 1}, {Name: "closed", Addr: closedUDP(t), Weight: 1}}}
	cfg, err := policy.Compile(&policy.Config{Services: []*policy.VirtualServer{vs}})
	if err != nil {
		t.Fatal(err)
	}
	b := balancer.New(cfg.Services[0], cfg.Balancer)
	c := &Checker{
		Plan: func() Plan {
			vs := cfg.ServiceByName("dns")
			return Plan{Settings: *vs.Health, Targets: ServiceTargets(vs, func(policy.DialVia) DialFunc { return nil },
				func(policy.DialVia) UDPDialFunc { return HostDialUDP })}
		},
		Report: func(name string, r Result, now time.Time) { b.ReportCheck(name, r.OK, r.Reason, now) },
		Now:    func() time.Time { return t0 },
	}
	step := func(what string, upA, upClosed bool, reasonA string) {
		t.Helper()
		c.CheckOnce(context.Background())
		var got []bool
		var checkA *balancer.CheckStatus
		for _, ts := range b.Snapshot(t0).Targets {
			got = append(got, ts.HealthUp)
			if ts.Name == "a" {
				checkA = ts.Check
			}
		}
		if got[0] != upA || got[1] != upClosed || checkA == nil || checkA.Reason != reasonA {
			t.Fatalf("%s: up %v, a's check %+v; want up [%v %v], reason %q", what, got, checkA, upA, upClosed, reasonA)
		}
	}
	step("round 1", true, true, "")
	step("round 2", true, true, "")
	step("round 3", true, false, "")
	srv.set(silentUDP)
	step("silent 1", true, false, ReasonTimeout)
	step("silent 2", true, false, ReasonTimeout)
	step("silent 3", false, false, ReasonTimeout)
	srv.set(dnsOK)
	step("answering 1", false, false, "")
	step("answering 2", true, false, "")
	if ts := b.Snapshot(t0).Targets[1]; ts.Check == nil || ts.Check.Reason != ReasonRefused {
		t.Errorf("the closed port's check: %+v, want refused", ts.Check)
	}
}
