package udp

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"weir/netstack/proxy"
	"weir/policy"
)

// testAdmitter admits sessions round robin over the service's targets, at
// most max open at once (0: no limit), as weir's admission with a
// maxConnections would; it records every End.
type testAdmitter struct {
	max    int64
	open   atomic.Int64
	next   atomic.Uint64
	failed atomic.Int64 // TargetFailed calls: the target marked down

	mu   sync.Mutex
	ends []proxy.End
}

func (a *testAdmitter) Admit(req *proxy.ConnRequest) (proxy.Decision, proxy.Session) {
	s := &testSession{a: a}
	if a.max > 0 && a.open.Add(1) > a.max {
		a.open.Add(-1)
		return proxy.Decision{Verdict: proxy.RefuseRST, Limit: "maxConnections", Value: a.max}, s
	} else if a.max <= 0 {
		a.open.Add(1)
	}
	s.held = true
	ts := req.Service.Targets
	return proxy.Decision{Verdict: proxy.Accept, Target: ts[a.next.Add(1)%uint64(len(ts))]}, s
}

func (a *testAdmitter) endList() []proxy.End {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]proxy.End(nil), a.ends...)
}

type testSession struct {
	a    *testAdmitter
	held bool
}

func (s *testSession) DialFailed(proxy.Decision, error) proxy.Decision {
	s.Released()
	return proxy.Decision{Verdict: proxy.RefuseRST}
}
func (s *testSession) TargetFailed(proxy.Decision, error) { s.a.failed.Add(1) }
func (*testSession) Spliced(int64)                        {}
func (s *testSession) Released() {
	if s.held {
		s.held = false
		s.a.open.Add(-1)
	}
}
func (s *testSession) End(e *proxy.End) {
	s.Released()
	s.a.mu.Lock()
	s.a.ends = append(s.a.ends, *e)
	s.a.mu.Unlock()
}

// echoTarget is a UDP server on the loopback answering each datagram with
// its name, a space and the datagram; with a delay, it moves clock on by
// that much before each answer (a target that takes that long to answer,
// on the relay's clock).
func echoTarget(t *testing.T, name string, clock *manualClock, delay time.Duration) *policy.Target {
	t.Helper()
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	go func() {
		b := make([]byte, MaxDatagram)
		for {
			n, from, err := c.ReadFromUDPAddrPort(b)
			if err != nil {
				return
			}
			if delay > 0 {
				clock.Add(delay)
			}
			c.WriteToUDPAddrPort(append([]byte(name+" "), b[:n]...), from)
		}
	}()
	return &policy.Target{Name: name, Addr: c.LocalAddr().(*net.UDPAddr).AddrPort(), Weight: 1}
}

// rig is a relay behind a VIP socket on the loopback: a reader goroutine
// hands each datagram to Datagram, as weir/netstack's VIP sockets do.
type rig struct {
	t     *testing.T
	r     *Relay
	adm   *testAdmitter
	vs    *policy.VirtualServer
	vip   *net.UDPConn
	clock *manualClock
}

type manualClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *manualClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *manualClock) Add(d time.Duration) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	return c.now
}

type connReplier struct{ c *net.UDPConn }

func (r connReplier) WriteTo(b []byte, to netip.AddrPort) error {
	_, err := r.c.WriteToUDPAddrPort(b, to)
	return err
}

func newRig(t *testing.T, o UDPTestOptions) *rig {
	t.Helper()
	vs := &policy.VirtualServer{Name: "dns", Proto: policy.ProtoUDP, Ports: policy.PortRange{Lo: 53, Hi: 53},
		UDP: policy.UDPOptions{IdleTimeout: 30 * time.Second, Responses: o.responses, ResponseTimeout: 2 * time.Second, MaxSessions: o.perVIP}}
	clock := &manualClock{now: time.Unix(1000, 0)}
	for _, n := range []string{"a", "b"} {
		if n == "b" && o.silent {
			vs.Targets = append(vs.Targets, silentTarget(t, n))
			continue
		}
		vs.Targets = append(vs.Targets, echoTarget(t, n, clock, o.delay[n]))
	}
	adm := &testAdmitter{max: o.maxConns}
	r := New(Options{Admitter: adm, Host: &HostDialer{}, MaxSessions: o.table, Now: clock.Now})
	vip, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	g := &rig{t: t, r: r, adm: adm, vs: vs, vip: vip, clock: clock}
	done := make(chan struct{})
	go func() {
		defer close(done)
		b := make([]byte, MaxDatagram)
		for {
			n, from, err := vip.ReadFromUDPAddrPort(b)
			if err != nil {
				return
			}
			r.Datagram(connReplier{vip}, from, vip.LocalAddr().(*net.UDPAddr).AddrPort(), vs, b[:n])
		}
	}()
	t.Cleanup(func() {
		vip.Close()
		<-done
		r.Close()
		if n := r.Stats().Sessions; n != 0 {
			t.Errorf("%d sessions open after Close", n)
		}
	})
	return g
}

type UDPTestOptions struct {
	responses, perVIP, table int
	maxConns                 int64
	silent                   bool                     // target b reads and never answers (its server hung)
	delay                    map[string]time.Duration // a target's time to answer, on the rig's clock
}

// silentTarget is a UDP socket on the loopback that reads every datagram
// and answers none, with no ICMP either: a hung server.
func silentTarget(t *testing.T, name string) *policy.Target {
	t.Helper()
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	go func() {
		b := make([]byte, MaxDatagram)
		for {
			if _, _, err := c.ReadFromUDPAddrPort(b); err != nil {
				return
			}
		}
	}()
	return &policy.Target{Name: name, Addr: c.LocalAddr().(*net.UDPAddr).AddrPort(), Weight: 1}
}

// client is a client socket of the rig's VIP.
func (g *rig) client() *net.UDPConn {
	g.t.Helper()
	c, err := net.DialUDP("udp", nil, g.vip.LocalAddr().(*net.UDPAddr))
	if err != nil {
		g.t.Fatal(err)
	}
	g.t.Cleanup(func() { c.Close() })
	return c
}

// ask sends q and returns the reply, or "" after the wait.
func ask(t *testing.T, c *net.UDPConn, q string, wait time.Duration) string {
	t.Helper()
	if _, err := c.Write([]byte(q)); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(wait))
	b := make([]byte, 2048)
	n, err := c.Read(b)
	if err != nil {
		return ""
	}
	return string(b[:n])
}

// waitFor waits for cond, failing after 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestResponsesEndSession: with udp.responses 1 each query is a session of
// its own that ends with its reply; queries from new ports alternate over
// the targets; the reply comes from the VIP socket (a connected client
// socket receives only from there) with the datagram's bytes intact.
func TestResponsesEndSession(t *testing.T) {
	g := newRig(t, UDPTestOptions{responses: 1})
	got := map[string]int{}
	for i := range 20 {
		c := g.client()
		q := fmt.Sprintf("query-%d", i)
		a := ask(t, c, q, 5*time.Second)
		name, rest, _ := bytes.Cut([]byte(a), []byte(" "))
		if string(rest) != q {
			t.Fatalf("query %q: reply %q", q, a)
		}
		got[string(name)]++
	}
	if got["a"] != 10 || got["b"] != 10 {
		t.Errorf("targets %v, want 10 each", got)
	}
	waitFor(t, "20 ended sessions", func() bool { return g.r.Stats().EndedResponses == 20 })
	st := g.r.Stats()
	if st.Sessions != 0 || st.Created != 20 || st.DatagramsIn != 20 || st.DatagramsOut != 20 {
		t.Errorf("stats %+v", st)
	}
	if g.adm.open.Load() != 0 {
		t.Errorf("%d admission slots still held", g.adm.open.Load())
	}
	for _, e := range g.adm.endList() {
		if e.Outcome != proxy.Served || e.Stats.ClientLeg.SegmentsSent != 1 || e.Stats.TargetLeg.BytesSent < uint64(len("query-0")) {
			t.Errorf("end %+v", e)
		}
	}
}

// TestIdleExpiry: a session lives while datagrams come and ends idle
// timeout after the last one, on the relay's clock; its slot is free then.
func TestIdleExpiry(t *testing.T) {
	g := newRig(t, UDPTestOptions{maxConns: 1})
	c := g.client()
	if a := ask(t, c, "one", 5*time.Second); a == "" {
		t.Fatal("no reply")
	}
	t0 := g.clock.Now()
	g.r.Sweep(t0.Add(29 * time.Second))
	if g.r.Stats().Sessions != 1 {
		t.Fatal("session ended before its idle timeout")
	}
	g.clock.Add(20 * time.Second)
	if a := ask(t, c, "two", 5*time.Second); a == "" {
		t.Fatal("no reply on the open session")
	}
	// A second client is refused while the one slot is held.
	other := g.client()
	if a := ask(t, other, "x", 300*time.Millisecond); a != "" {
		t.Fatalf("second client answered %q at maxConnections 1", a)
	}
	if g.r.Stats().Refused != 1 {
		t.Fatalf("refused %d, want 1", g.r.Stats().Refused)
	}
	next := g.r.Sweep(t0.Add(45 * time.Second))
	if g.r.Stats().Sessions != 1 {
		t.Fatal("session ended 25 s after its last datagram")
	}
	if want := t0.Add(50 * time.Second); !next.Equal(want) {
		t.Errorf("next deadline %v, want %v", next, want)
	}
	g.r.Sweep(t0.Add(50 * time.Second))
	st := g.r.Stats()
	if st.Sessions != 0 || st.EndedIdle != 1 {
		t.Fatalf("after the idle timeout: %+v", st)
	}
	if g.adm.open.Load() != 0 {
		t.Fatal("slot still held after the idle end")
	}
	if a := ask(t, other, "y", 5*time.Second); a == "" {
		t.Fatal("the freed slot did not take the second client")
	}
	ends := g.adm.endList()
	if len(ends) < 2 || ends[1].Outcome != proxy.IdleClosed || ends[1].Stats.ClientLeg.SegmentsReceived != 2 {
		t.Errorf("ends %+v", ends)
	}
}

// TestSizeBounds: the table bound and the per-VIP bound drop new sessions'
// datagrams, counted; the open sessions go on.
func TestSizeBounds(t *testing.T) {
	for _, tc := range []struct {
		name          string
		o             UDPTestOptions
		full, vipFull uint64
	}{
		{"table", UDPTestOptions{table: 3}, 2, 0},
		{"vip", UDPTestOptions{perVIP: 3}, 0, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := newRig(t, tc.o)
			var cs []*net.UDPConn
			answered := 0
			for range 5 {
				c := g.client()
				cs = append(cs, c)
				if ask(t, c, "q", 300*time.Millisecond) != "" {
					answered++
				}
			}
			st := g.r.Stats()
			if answered != 3 || st.Sessions != 3 || st.DroppedFull != tc.full || st.DroppedVIP != tc.vipFull {
				t.Fatalf("answered %d, stats %+v", answered, st)
			}
			for _, c := range cs[:3] {
				if ask(t, c, "again", 5*time.Second) == "" {
					t.Fatal("an open session lost its reply")
				}
			}
		})
	}
}

// blackhole is a Target that never answers: the table's own cost, with no
// kernel socket.
type blackhole struct{ done chan struct{} }

func (b *blackhole) ReadDatagram(*sync.Pool) (*[]byte, int, error) {
	<-b.done
	return nil, 0, net.ErrClosed
}
func (b *blackhole) Write(p []byte) (int, error) { return len(p), nil }
func (b *blackhole) Close() error                { close(b.done); return nil }

type blackholeDialer struct{}

func (blackholeDialer) DialUDP(context.Context, netip.AddrPort) (Target, error) {
	return &blackhole{done: make(chan struct{})}, nil
}

type nopReplier struct{}

func (nopReplier) WriteTo([]byte, netip.AddrPort) error { return nil }

// TestFloodBounded: a flood of datagrams from new (spoofed) sources makes
// at most MaxSessions sessions; the rest are dropped and counted, and the
// memory per session stays small (logged: bytes per session with its
// reader goroutine, without a kernel socket). Sweeping them all ends them.
func TestFloodBounded(t *testing.T) {
	const max, flood = 20000, 50000
	vs := &policy.VirtualServer{Name: "dns", Proto: policy.ProtoUDP,
		UDP:     policy.UDPOptions{IdleTimeout: 30 * time.Second},
		Targets: []*policy.Target{{Name: "t", Addr: netip.MustParseAddrPort("198.18.1.1:53")}}}
	clock := &manualClock{now: time.Unix(1000, 0)}
	adm := &testAdmitter{}
	r := New(Options{Admitter: adm, Host: blackholeDialer{}, MaxSessions: max, Now: clock.Now})
	defer r.Close()
	vip := netip.MustParseAddrPort("198.18.0.53:53")
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	q := []byte("query")
	for i := range flood {
		src := netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 19, byte(i >> 8), byte(i)}), uint16(1024+i%60000))
		r.Datagram(nopReplier{}, src, vip, vs, q)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	st := r.Stats()
	if st.Sessions != max || st.Created != max || st.DroppedFull != flood-max {
		t.Fatalf("stats %+v", st)
	}
	per := float64((after.HeapInuse+after.StackInuse)-(before.HeapInuse+before.StackInuse)) / max
	t.Logf("%.0f bytes per session (table, heap entry, admission double, reader goroutine; no kernel socket) at %d sessions", per, max)
	if per > 16<<10 {
		t.Errorf("%.0f bytes per session", per)
	}
	r.Sweep(clock.Add(31 * time.Second))
	if st := r.Stats(); st.Sessions != 0 || st.EndedIdle != max {
		t.Fatalf("after the sweep: %+v", st)
	}
}

// TestUnanswered: a request/response session whose target does not reply
// within udp.responseTimeout ends then (not at its idle timeout), counted
// unanswered for its target; Sample reports each target's sessions and
// unanswered ones once.
func TestUnanswered(t *testing.T) {
	g := newRig(t, UDPTestOptions{responses: 1, silent: true})
	t0 := g.clock.Now()
	answered := 0
	for i := range 4 { // a, b, a, b: two answered, two not
		if ask(t, g.client(), fmt.Sprint("q", i), 300*time.Millisecond) != "" {
			answered++
		}
	}
	if answered != 2 {
		t.Fatalf("%d answered, want 2", answered)
	}
	waitFor(t, "two sessions ended by their replies", func() bool { return g.r.Stats().EndedResponses == 2 })
	g.r.Sweep(t0.Add(1999 * time.Millisecond))
	if st := g.r.Stats(); st.Sessions != 2 {
		t.Fatalf("before the response timeout: %+v", st)
	}
	g.r.Sweep(t0.Add(2 * time.Second))
	if st := g.r.Stats(); st.Sessions != 0 || st.EndedUnanswered != 2 {
		t.Fatalf("after the response timeout: %+v", st)
	}
	got := g.r.Sample()
	want := map[TargetKey]Answers{{"dns", "a"}: {Sessions: 2}, {"dns", "b"}: {Sessions: 2, Unanswered: 2}}
	if len(got) != 2 || got[TargetKey{"dns", "a"}] != want[TargetKey{"dns", "a"}] || got[TargetKey{"dns", "b"}] != want[TargetKey{"dns", "b"}] {
		t.Errorf("Sample %v, want %v", got, want)
	}
	if again := g.r.Sample(); len(again) != 0 {
		t.Errorf("second Sample %v, want nothing new", again)
	}
	for _, e := range g.adm.endList() {
		if e.Stats.Target == "b" && e.Outcome != proxy.TargetTimedOut {
			t.Errorf("b's session ended %v", e.Outcome)
		}
	}
}

// TestQueueFlush: the datagrams a VIP reader queues while more wait
// behind them reach the target as they were, each session's in its
// order, whether a Flush writes them or a full batch does (more than
// batchMax datagrams, more than batchArena bytes), with sizes from 2
// bytes to 60 000; the counters count each once.
func TestQueueFlush(t *testing.T) {
	srv, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	srv.SetReadBuffer(8 << 20)
	vs := &policy.VirtualServer{Name: "stream", Proto: policy.ProtoUDP, Ports: policy.PortRange{Lo: 5201, Hi: 5201},
		UDP:     policy.UDPOptions{IdleTimeout: 30 * time.Second},
		Targets: []*policy.Target{{Name: "a", Addr: srv.LocalAddr().(*net.UDPAddr).AddrPort(), Weight: 1}}}
	r := New(Options{Admitter: &testAdmitter{}, Host: &HostDialer{}})
	defer r.Close()
	vip := netip.MustParseAddrPort("198.18.0.10:5201")
	clients := []netip.AddrPort{netip.MustParseAddrPort("198.18.1.1:4000"), netip.MustParseAddrPort("198.18.1.2:4000")}
	sizes := []int{2, 1400, 9000, 60000, 512}
	var bt Batch
	var sent [2][][]byte
	var bytesIn uint64
	queue := func(c int) {
		seq := len(sent[c])
		b := bytes.Repeat([]byte{'x'}, sizes[seq%len(sizes)])
		b[0], b[1] = byte(seq), byte(c) // the order, as the client sent it, and the client
		sent[c] = append(sent[c], b)
		bytesIn += uint64(len(b))
		r.Queue(&bt, nopReplier{}, clients[c], vip, vs, b)
	}
	// Runs of one client's datagrams, then the other's: 150 of client 0
	// (beyond batchMax and batchArena), 3 of client 1, 1 of client 0, a
	// Flush, 40 more of client 1.
	for range 150 {
		queue(0)
	}
	for range 3 {
		queue(1)
	}
	queue(0)
	r.Flush(&bt)
	for range 40 {
		queue(1)
	}
	r.Flush(&bt)
	want := len(sent[0]) + len(sent[1])
	got := map[netip.AddrPort][][]byte{}
	buf := make([]byte, MaxDatagram)
	srv.SetReadDeadline(time.Now().Add(10 * time.Second))
	for n := 0; n < want; n++ {
		k, from, err := srv.ReadFromUDPAddrPort(buf)
		if err != nil {
			t.Fatalf("the target got %d of %d datagrams: %v", n, want, err)
		}
		got[from] = append(got[from], bytes.Clone(buf[:k]))
	}
	if len(got) != 2 {
		t.Fatalf("the target saw %d sessions' sockets, want 2", len(got))
	}
	for _, ds := range got {
		c := int(ds[0][1])
		if len(ds) != len(sent[c]) {
			t.Fatalf("client %d: %d datagrams arrived, %d sent", c, len(ds), len(sent[c]))
		}
		for i := range ds {
			if !bytes.Equal(ds[i], sent[c][i]) {
				t.Fatalf("client %d: datagram %d arrived as %d bytes starting %d, sent %d bytes starting %d",
					c, i, len(ds[i]), ds[i][0], len(sent[c][i]), sent[c][i][0])
			}
		}
	}
	st := r.Stats()
	if st.DatagramsIn != uint64(want) || st.BytesIn != bytesIn || st.WriteErrors != 0 || st.Created != 2 {
		t.Errorf("stats %+v; want %d datagrams, %d bytes in, 2 sessions, no write error", st, want, bytesIn)
	}
}

// TestICMPAfterReplies: ICMP port unreachable ends a session either way,
// but marks its target down (TargetFailed) only when the target never
// answered in it: a server that closed its socket after answering (a
// restart, the end of a stream whose client still sends) is not a target
// refusing sessions.
func TestICMPAfterReplies(t *testing.T) {
	for _, answered := range []bool{true, false} {
		t.Run(fmt.Sprintf("answered=%v", answered), func(t *testing.T) {
			srv, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
			if err != nil {
				t.Fatal(err)
			}
			addr := srv.LocalAddr().(*net.UDPAddr).AddrPort()
			vs := &policy.VirtualServer{Name: "s", Proto: policy.ProtoUDP, Ports: policy.PortRange{Lo: 9, Hi: 9},
				UDP:     policy.UDPOptions{IdleTimeout: 30 * time.Second},
				Targets: []*policy.Target{{Name: "a", Addr: addr, Weight: 1}}}
			adm := &testAdmitter{}
			r := New(Options{Admitter: adm, Host: &HostDialer{}})
			defer r.Close()
			client, vip := netip.MustParseAddrPort("198.18.1.1:4000"), netip.MustParseAddrPort("198.18.0.10:9")
			out := &countReplier{}
			if answered {
				r.Datagram(out, client, vip, vs, []byte("hello"))
				b := make([]byte, 64)
				n, from, err := srv.ReadFromUDPAddrPort(b)
				if err != nil {
					t.Fatal(err)
				}
				srv.WriteToUDPAddrPort(b[:n], from)
				waitFor(t, "the reply relayed", func() bool { return out.n.Load() == 1 })
			}
			srv.Close() // the server's socket is gone: ICMP port unreachable (the loopback has no ICMP rate limit)
			r.Datagram(out, client, vip, vs, []byte("more"))
			waitFor(t, "the session ended on ICMP", func() bool { return r.Stats().EndedError == 1 })
			if got, want := adm.failed.Load() > 0, !answered; got != want {
				t.Fatalf("target marked down %v, want %v (it answered before: %v)", got, want, answered)
			}
			if answered {
				// The client sends on: its new session meets the closed
				// port before any reply.
				r.Datagram(out, client, vip, vs, []byte("again"))
				waitFor(t, "the new session ended on ICMP", func() bool { return r.Stats().EndedError == 2 })
				if adm.failed.Load() != 1 {
					t.Errorf("a new session that met ICMP before any reply: target marked down %d times, want 1", adm.failed.Load())
				}
			}
		})
	}
}

// TestWriteBatchGSO: runs of equal datagrams go to a kernel target in
// UDP_SEGMENT sends (at most 64 segments, 65 000 bytes each) and arrive as
// the datagrams they were, in order, the run's shorter last one included;
// the datagrams no run holds go by sendmmsg.
func TestWriteBatchGSO(t *testing.T) {
	srv, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	srv.SetReadBuffer(8 << 20)
	tg, err := (&HostDialer{}).DialUDP(context.Background(), srv.LocalAddr().(*net.UDPAddr).AddrPort())
	if err != nil {
		t.Fatal(err)
	}
	defer tg.Close()
	ht := tg.(*hostTarget)
	var bs [][]byte
	add := func(n, size int) {
		for range n {
			b := bytes.Repeat([]byte{byte(len(bs))}, size)
			bs = append(bs, b)
		}
	}
	add(100, 1448) // runs of 44 (the byte bound) and the rest
	add(1, 700)    // the last of a run, shorter
	add(3, 9000)
	add(1, 1)
	add(2, 300)
	if n, err := ht.WriteBatch(bs); n != len(bs) || err != nil {
		t.Fatalf("WriteBatch wrote %d of %d: %v", n, len(bs), err)
	}
	buf := make([]byte, MaxDatagram)
	srv.SetReadDeadline(time.Now().Add(10 * time.Second))
	for i, want := range bs {
		n, _, err := srv.ReadFromUDPAddrPort(buf)
		if err != nil {
			t.Fatalf("datagram %d of %d: %v", i, len(bs), err)
		}
		if !bytes.Equal(buf[:n], want) {
			t.Fatalf("datagram %d arrived as %d bytes of %d, sent %d of %d", i, n, buf[0], len(want), want[0])
		}
	}
	if ht.gsoSends == 0 {
		t.Errorf("no UDP_SEGMENT send (gso %v)", ht.gso)
	}
	t.Logf("%d datagrams in %d UDP_SEGMENT sends and sendmmsg", len(bs), ht.gsoSends)
}

func TestGSORun(t *testing.T) {
	sizes := func(ns ...int) [][]byte {
		var bs [][]byte
		for _, n := range ns {
			bs = append(bs, make([]byte, n))
		}
		return bs
	}
	for _, c := range []struct {
		bs   [][]byte
		want int
	}{
		{sizes(100), 1},
		{sizes(100, 100, 100), 3},
		{sizes(100, 100, 50, 100), 3}, // a shorter one ends the run
		{sizes(100, 200), 1},          // a larger one cannot follow
		{sizes(0, 0), 1},              // empty datagrams go alone
		{sizes(100, 0), 1},
		{sizes(30000, 30000, 30000), 2}, // 65 000 bytes at most
		{make([][]byte, 70), 1},
	} {
		if got := gsoRun(c.bs); got != c.want {
			t.Errorf("gsoRun(%d datagrams, first %d bytes) = %d, want %d", len(c.bs), len(c.bs[0]), got, c.want)
		}
	}
	run := make([][]byte, 70)
	for i := range run {
		run[i] = make([]byte, 10)
	}
	if got := gsoRun(run); got != gsoSegments {
		t.Errorf("70 small datagrams: a run of %d, want %d", got, gsoSegments)
	}
}
