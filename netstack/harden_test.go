package netstack

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"weir/datapath"
	"weir/internal/testutil"
	"weir/netstack/proxy"
	"weir/policy"
)

// countingEcho is a host echo server that counts the connections it
// accepted: the backend's own count, for "no backend connection for a
// spoofed SYN".
func countingEcho(t testing.TB) (netip.AddrPort, *atomic.Int64, func()) {
	t.Helper()
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var n atomic.Int64
	stop := serveListener(l, func(c net.Conn) {
		n.Add(1)
		defer c.Close()
		_, _ = io.Copy(c, c)
	})
	return l.Addr().(*net.TCPAddr).AddrPort(), &n, stop
}

// spoofedSYN is a SYN from 198.19.(i>>8).(i&255), i ≥ 256, to dst: an
// address no stack in the rig answers for, so weir's SYN-ACKs go nowhere.
func spoofedSYN(i int, dst netip.AddrPort) []byte {
	src := netip.AddrFrom4([4]byte{198, 19, byte(i >> 8), byte(i)})
	return rawSYN(netip.AddrPortFrom(src, uint16(1024+i%60000)), dst)
}

// TestSYNFloodCookies: spoofed SYNs at a listened VIP overflow its backlog
// into SYN cookies; real clients of that VIP and of another keep being
// served, no spoofed SYN reaches Admit or the backend, and nothing is
// pending once the flood is over.
func TestSYNFloodCookies(t *testing.T) {
	taddr, accepts, stop := countingEcho(t)
	defer stop()
	other := netip.MustParseAddr("198.19.0.81")
	perVIP := policy.Timeouts{InFlightPerVIP: 16}
	vsA := &policy.VirtualServer{Name: "a", VIPs: []netip.Addr{vipV4}, Ports: policy.PortRange{Lo: 80, Hi: 80}, Timeouts: perVIP}
	vsB := &policy.VirtualServer{Name: "b", VIPs: []netip.Addr{other}, Ports: policy.PortRange{Lo: 80, Hi: 80}, Timeouts: perVIP}
	lookup := func(a netip.Addr, p uint16) *policy.VirtualServer {
		if s := services(vsA)(a, p); s != nil {
			return s
		}
		return services(vsB)(a, p)
	}
	adm := &testAdmitter{target: &policy.Target{Name: "t", Addr: taddr}}
	r := newRig(t, rigOptions{
		fwd:    fwdOptions{Services: lookup, Admitter: adm},
		listen: []*policy.VirtualServer{vsA, vsB},
	})
	if st := r.stats(); st.Listeners != 2 {
		t.Fatalf("%d listeners, want 2", st.Listeners)
	}
	const spoofed = 20000
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		dst := netip.AddrPortFrom(vipV4, 80)
		batch := make([][]byte, 0, 64)
		for i := 256; i < 256+spoofed; i++ {
			batch = append(batch, spoofedSYN(i, dst))
			if len(batch) == cap(batch) {
				_, _ = r.clientDev.Write(batch, 0)
				batch = batch[:0]
			}
		}
		_, _ = r.clientDev.Write(batch, 0)
	}()
	echoOnce := func(vip netip.Addr) error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, err := r.client.DialTCP(ctx, netip.AddrPort{}, netip.AddrPortFrom(vip, 80))
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.WriteString(c, "ping"); err != nil {
			return err
		}
		b := make([]byte, 4)
		if _, err := io.ReadFull(c, b); err != nil || string(b) != "ping" {
			return errors.New("echo failed: " + string(b))
		}
		return nil
	}
	const real = 40
	var failed int
	for i := 0; i < real; i++ {
		vip := vipV4
		if i%4 == 3 {
			vip = other
		}
		if err := echoOnce(vip); err != nil {
			failed++
			t.Logf("real connection %d to %v: %v", i, vip, err)
		}
	}
	wg.Wait()
	st := r.stats()
	t.Logf("flood of %d spoofed SYNs: %+v", spoofed, st)
	if failed > 0 {
		t.Errorf("%d of %d real connections failed under the flood", failed, real)
	}
	if st.SYNCookiesSent == 0 {
		t.Errorf("no SYN cookie sent: the backlog of 16 never overflowed")
	}
	if n := adm.nAdmit.Load(); n != real {
		t.Errorf("Admit called %d times, want %d (the real connections only)", n, real)
	}
	if n := accepts.Load(); n != real {
		t.Errorf("the backend accepted %d connections, want %d", n, real)
	}
	testutil.Eventually(t, 10*time.Second, func() bool { return r.stats().Pending == 0 }, "pending left: %+v", r.stats())
}

// TestListenFollowsServices: Listen opens listeners for new VIPs and ports
// and closes the removed ones; a port range wider than MaxListenPorts takes
// the tcp.Forwarder path and is served there.
func TestListenFollowsServices(t *testing.T) {
	taddr, _, stop := countingEcho(t)
	defer stop()
	narrow := &policy.VirtualServer{Name: "n", VIPs: []netip.Addr{vipV4, vipV6}, Ports: policy.PortRange{Lo: 80, Hi: 81}}
	wide := &policy.VirtualServer{Name: "w", VIPs: []netip.Addr{vipV4}, Ports: policy.PortRange{Lo: 1000, Hi: 1000 + MaxListenPorts}}
	var cur atomic.Pointer[[]*policy.VirtualServer]
	lookup := func(a netip.Addr, p uint16) *policy.VirtualServer {
		for _, vs := range *cur.Load() {
			if s := services(vs)(a, p); s != nil {
				return s
			}
		}
		return nil
	}
	both := []*policy.VirtualServer{narrow, wide}
	cur.Store(&both)
	adm := &testAdmitter{target: &policy.Target{Name: "t", Addr: taddr}}
	r := newRig(t, rigOptions{fwd: fwdOptions{Services: lookup, Admitter: adm}, listen: both})
	if n := r.stats().Listeners; n != 4 {
		t.Fatalf("%d listeners, want 4 (2 VIPs × 2 ports; the wide range has none)", n)
	}
	for _, vip := range []netip.AddrPort{
		netip.AddrPortFrom(vipV4, 81), netip.AddrPortFrom(vipV6, 80), netip.AddrPortFrom(vipV4, 1000+MaxListenPorts),
	} {
		c := dial(t, r.client, vip)
		io.WriteString(c, "x")
		b := make([]byte, 1)
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadFull(c, b); err != nil {
			t.Errorf("%v: %v", vip, err)
		}
		c.Close()
	}
	only := []*policy.VirtualServer{wide}
	cur.Store(&only)
	if err := r.fwd.Listen(only); err != nil {
		t.Fatal(err)
	}
	if n := r.stats().Listeners; n != 0 {
		t.Fatalf("%d listeners after removing the narrow service, want 0", n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := r.client.DialTCP(ctx, netip.AddrPort{}, netip.AddrPortFrom(vipV4, 80))
	wantReset(t, c, err)
}

// silentServer accepts connections and never reads or answers; it counts
// them.
func silentServer(t testing.TB) (netip.AddrPort, *atomic.Int64, func()) {
	t.Helper()
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var n atomic.Int64
	done := make(chan struct{})
	stop := serveListener(l, func(c net.Conn) {
		n.Add(1)
		<-done
		c.Close()
	})
	return l.Addr().(*net.TCPAddr).AddrPort(), &n, func() { close(done); stop() }
}

// TestFirstByteTimeout: a target that accepts and never answers is given
// up after the first-byte timeout: the http client gets the 503 page, the
// tcp client a RST, and the session hears TargetFailed (weir marks the
// target down).
func TestFirstByteTimeout(t *testing.T) {
	taddr, accepted, stop := silentServer(t)
	defer stop()
	const fb = 300 * time.Millisecond
	web := &policy.VirtualServer{Name: "web", VIPs: []netip.Addr{vipV4}, Ports: policy.PortRange{Lo: 8080, Hi: 8080}, Proto: policy.ProtoHTTP,
		Timeouts: policy.Timeouts{FirstByte: fb}}
	raw := &policy.VirtualServer{Name: "raw", VIPs: []netip.Addr{vipV4}, Ports: policy.PortRange{Lo: 80, Hi: 80},
		Timeouts: policy.Timeouts{FirstByte: fb}}
	lookup := func(a netip.Addr, p uint16) *policy.VirtualServer {
		if s := services(web)(a, p); s != nil {
			return s
		}
		return services(raw)(a, p)
	}
	adm := &testAdmitter{target: &policy.Target{Name: "silent", Addr: taddr}}
	r := newRig(t, rigOptions{fwd: fwdOptions{Services: lookup, Admitter: adm}, listen: []*policy.VirtualServer{web, raw}})

	t.Run("http-503", func(t *testing.T) {
		c := dial(t, r.client, netip.AddrPortFrom(vipV4, 8080))
		defer c.Close()
		t0 := time.Now()
		io.WriteString(c, "GET / HTTP/1.0\r\n\r\n")
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("no response: %v", err)
		}
		body, _ := io.ReadAll(resp.Body)
		el := time.Since(t0)
		if resp.StatusCode != 503 || !strings.Contains(string(body), "firstByte") {
			t.Errorf("got %d %q, want a 503 naming firstByte", resp.StatusCode, body)
		}
		if el < fb || el > fb+3*time.Second {
			t.Errorf("answered after %v, want about %v", el, fb)
		}
		t.Logf("silent target given up after %v", el)
	})
	t.Run("tcp-rst", func(t *testing.T) {
		c := dial(t, r.client, netip.AddrPortFrom(vipV4, 80))
		io.WriteString(c, "hello")
		wantReset(t, c, nil)
	})
	testutil.Eventually(t, 5*time.Second, func() bool { return r.stats().TargetTimedOut == 2 }, "stats %+v", r.stats())
	if n := adm.nTargetFailed.Load(); n != 2 {
		t.Errorf("TargetFailed %d times, want 2", n)
	}
	if n := adm.nFailedLate.Load(); n != 0 {
		t.Errorf("TargetFailed came after Released %d times: the lease was given back first, so weir marks nothing down", n)
	}
	if n := accepted.Load(); n != 2 {
		t.Errorf("the silent target accepted %d, want 2", n)
	}
	if got := adm.outcomes(); len(got) != 2 || got[0] != proxy.TargetTimedOut || got[1] != proxy.TargetTimedOut {
		t.Errorf("outcomes %v, want two target-timeout", got)
	}
}

// panicDialer dials host sockets whose reads call fire("splice") first: a
// splice half's read that panics when the test says so.
type panicDialer struct {
	HostDialer
	fire func(stage string)
}

func (d *panicDialer) DialTarget(ctx context.Context, addr netip.AddrPort) (proxy.Leg, error) {
	leg, err := d.HostDialer.DialTarget(ctx, addr)
	if err != nil {
		return nil, err
	}
	return &panicLeg{Leg: leg, fire: d.fire}, nil
}

type panicLeg struct {
	proxy.Leg
	fire func(stage string)
}

func (l *panicLeg) ReadLent(pool *sync.Pool, bp *[]byte) (*[]byte, int, error) {
	l.fire("splice")
	return l.Leg.ReadLent(pool, bp)
}

// blackholeDialer never completes a dial: a target whose SYNs go
// unanswered.
type blackholeDialer struct{ n atomic.Int64 }

func (d *blackholeDialer) DialTarget(ctx context.Context, _ netip.AddrPort) (proxy.Leg, error) {
	d.n.Add(1)
	<-ctx.Done()
	return nil, ctx.Err()
}

// TestConnectTimeout: the virtual server's connect timeout bounds a dial
// to a silent target, which counts as a failed dial (the session is asked
// for another target) and the client gets a RST, not a hang.
func TestConnectTimeout(t *testing.T) {
	const ct = 200 * time.Millisecond
	vs := &policy.VirtualServer{Name: "tcp", VIPs: []netip.Addr{vipV4}, Ports: policy.PortRange{Lo: 80, Hi: 80}, Timeouts: policy.Timeouts{Connect: ct}}
	bh := &blackholeDialer{}
	tgt := &policy.Target{Name: "t", Addr: netip.MustParseAddrPort("127.0.0.1:9")}
	adm := &testAdmitter{admit: func(*proxy.ConnRequest) proxy.Decision {
		return proxy.Decision{Verdict: proxy.Accept, Target: tgt, Dialer: bh}
	}}
	r := newRig(t, rigOptions{fwd: fwdOptions{Services: services(vs), Admitter: adm}, listen: []*policy.VirtualServer{vs}})
	t0 := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := r.client.DialTCP(ctx, netip.AddrPort{}, netip.AddrPortFrom(vipV4, 80))
	wantReset(t, c, err)
	el := time.Since(t0)
	if el < ct || el > ct+3*time.Second {
		t.Errorf("reset after %v, want about %v", el, ct)
	}
	if adm.nFailed.Load() != 1 || r.stats().DialFailed != 1 {
		t.Errorf("DialFailed %d, stats %+v; want 1", adm.nFailed.Load(), r.stats())
	}
}

// TestPanicContained: a panic in admission or in a splice half ends that
// connection only: it is counted, reported once with its stack, the
// session gets its one End, and the next connection is served.
func TestPanicContained(t *testing.T) {
	taddr, stopEcho := echoServer(t, "tcp4", "127.0.0.1:0")
	defer stopEcho()
	vs := &policy.VirtualServer{Name: "echo", VIPs: []netip.Addr{vipV4}, Ports: policy.PortRange{Lo: 80, Hi: 80}}
	var reports atomic.Int64
	var lastStack atomic.Value
	// inject names the stage to panic at, once: "admit" in the Admitter,
	// "splice" in the target leg's read (a splice half).
	var inject atomic.Pointer[string]
	fire := func(stage string) {
		if p := inject.Load(); p != nil && *p == stage && inject.CompareAndSwap(p, nil) {
			panic("injected at " + stage)
		}
	}
	tgt := &policy.Target{Name: "t", Addr: taddr}
	pd := &panicDialer{fire: fire}
	adm := &testAdmitter{admit: func(*proxy.ConnRequest) proxy.Decision {
		fire("admit")
		return proxy.Decision{Verdict: proxy.Accept, Target: tgt, Dialer: pd}
	}}
	r := newRig(t, rigOptions{
		fwd: fwdOptions{Services: services(vs), Admitter: adm, OnPanic: func(req *proxy.ConnRequest, v any, stack []byte) {
			// The stack first: the test reads it once it sees the count.
			lastStack.Store(string(stack))
			reports.Add(1)
		}},
		listen: []*policy.VirtualServer{vs},
	})
	echo := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c, err := r.client.DialTCP(ctx, netip.AddrPort{}, netip.AddrPortFrom(vipV4, 80))
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		io.WriteString(c, "hi")
		b := make([]byte, 2)
		_, err = io.ReadFull(c, b)
		return err
	}
	for i, stage := range []string{"admit", "splice"} {
		inject.Store(&stage)
		if err := echo(); err == nil {
			t.Errorf("%s: the panicking connection echoed", stage)
		}
		if inject.Load() != nil {
			t.Fatalf("%s: the stage never ran", stage)
		}
		testutil.Eventually(t, 5*time.Second, func() bool { return r.stats().Panics == uint64(i+1) && reports.Load() == int64(i+1) },
			"%s: panics %d, OnPanic called %d times", stage, r.stats().Panics, reports.Load())
		if s, _ := lastStack.Load().(string); !strings.Contains(s, "netstack") {
			t.Errorf("%s: the report has no stack: %q", stage, s)
		}
		if err := echo(); err != nil {
			t.Errorf("%s: the next connection failed: %v", stage, err)
		}
	}
	testutil.Eventually(t, 5*time.Second, func() bool { return r.stats().Open == 0 && r.stats().Pending == 0 }, "stats %+v", r.stats())
	got := adm.outcomes()
	panicked := 0
	for _, o := range got {
		if o == proxy.Panicked {
			panicked++
		}
	}
	// The admit panic came before any Session existed: no End for it.
	if panicked != 1 || adm.nEnds.Load() != 3 {
		t.Errorf("outcomes %v: want 3 Ends, 1 of them panic", got)
	}
}

// TestDrainRefusesBeforeHandshake: after Drain a SYN gets RST and no
// SYN-ACK (the client sees "connection refused"), on a listened VIP and on
// the tcp.Forwarder path alike, and Listen opens nothing.
func TestDrainRefusesBeforeHandshake(t *testing.T) {
	taddr, _, stop := countingEcho(t)
	defer stop()
	narrow := &policy.VirtualServer{Name: "n", VIPs: []netip.Addr{vipV4}, Ports: policy.PortRange{Lo: 80, Hi: 80}}
	wide := &policy.VirtualServer{Name: "w", VIPs: []netip.Addr{vipV4}, Ports: policy.PortRange{Lo: 1000, Hi: 1000 + MaxListenPorts}}
	lookup := func(a netip.Addr, p uint16) *policy.VirtualServer {
		if s := services(narrow)(a, p); s != nil {
			return s
		}
		return services(wide)(a, p)
	}
	var counter *tcpFlagCounter
	adm := &testAdmitter{target: &policy.Target{Name: "t", Addr: taddr}}
	r := newRig(t, rigOptions{fwd: fwdOptions{Services: lookup, Admitter: adm}, listen: []*policy.VirtualServer{narrow, wide},
		wrapFront: func(d datapath.Device) datapath.Device { counter = &tcpFlagCounter{Device: d}; return counter }})
	r.fwd.Drain()
	if err := r.fwd.Listen([]*policy.VirtualServer{narrow}); err != nil || r.stats().Listeners != 0 {
		t.Fatalf("Listen after Drain: %v, %d listeners", err, r.stats().Listeners)
	}
	before := counter.synAck.Load()
	for _, port := range []uint16{80, 1000} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := r.client.DialTCP(ctx, netip.AddrPort{}, netip.AddrPortFrom(vipV4, port))
		cancel()
		if !errors.Is(err, ErrConnectionRefused) {
			t.Errorf("port %d after Drain: %v, want refused", port, err)
		}
	}
	if n := counter.synAck.Load() - before; n != 0 {
		t.Errorf("%d SYN-ACKs after Drain", n)
	}
	if st := r.stats(); st.RefusedClosed != 2 || adm.nAdmit.Load() != 0 {
		t.Errorf("after Drain: %+v, %d admitted", st, adm.nAdmit.Load())
	}
}
