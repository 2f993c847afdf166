package netstack

import (
	"context"
	"io"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"weir/datapath"
	"weir/policy"
)

var (
	clientV4 = netip.MustParsePrefix("198.18.0.2/15")
	clientV6 = netip.MustParsePrefix("fd00::2/64")
	vipV4    = netip.MustParseAddr("198.19.0.80")
	vipV6    = netip.MustParseAddr("fd00::80")
)

// testAdmitter is an Admitter built from functions; nil functions accept to
// target (or refuse when target is nil).
type testAdmitter struct {
	target     *policy.Target
	action     *policy.Action
	admit      func(*ConnRequest) Decision
	dialFailed func(*ConnRequest, Decision, error) Decision

	mu      sync.Mutex
	closed  []ConnStats
	nClosed atomic.Int64
	nFailed atomic.Int64
	keep    bool // keep closed records
}

func (a *testAdmitter) Admit(r *ConnRequest) Decision {
	if a.admit != nil {
		return a.admit(r)
	}
	if a.target == nil {
		return Decision{Verdict: RefuseRST}
	}
	return Decision{Verdict: Accept, Target: a.target, Action: a.action}
}

func (a *testAdmitter) DialFailed(r *ConnRequest, d Decision, err error) Decision {
	a.nFailed.Add(1)
	if a.dialFailed != nil {
		return a.dialFailed(r, d, err)
	}
	return Decision{Verdict: RefuseRST}
}

func (a *testAdmitter) Closed(r *ConnRequest, d Decision, final ConnStats) {
	if a.keep {
		a.mu.Lock()
		a.closed = append(a.closed, final)
		a.mu.Unlock()
	}
	a.nClosed.Add(1)
}

// closedStats returns a copy of the kept final records.
func (a *testAdmitter) closedStats() []ConnStats {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]ConnStats(nil), a.closed...)
}

// rig is a weir front stack and a client stack joined by a memory pair.
type rig struct {
	weir, client *Stack
	fwd          *Forwarder
	front        *NIC
	clientNIC    *NIC
	clientDev    datapath.Device // the client's end, possibly wrapped
}

type rigOptions struct {
	fwd       ForwarderOptions
	stack     Options
	wrapFront func(datapath.Device) datapath.Device // wraps weir's device end
	rawClient bool                                  // no client stack: the test drives clientDev
}

func newRig(t testing.TB, o rigOptions) *rig {
	t.Helper()
	a, b := datapath.NewPipe(datapath.PipeOptions{QueueLen: 4096})
	var front datapath.Device = a
	if o.wrapFront != nil {
		front = o.wrapFront(a)
	}
	w, err := New(o.stack)
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{weir: w, clientDev: b}
	if r.front, err = w.AddNIC(front, NICOptions{Name: "front", Promiscuous: true}); err != nil {
		t.Fatal(err)
	}
	if o.fwd.Services == nil {
		o.fwd.Services = func(addr netip.Addr, port uint16) *policy.VirtualServer { return nil }
	}
	r.fwd = NewForwarder(w, o.fwd)
	t.Cleanup(r.close)
	if o.rawClient {
		return r
	}
	c, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	r.client = c
	if r.clientNIC, err = c.AddNIC(b, NICOptions{Name: "client", Addrs: []netip.Prefix{clientV4, clientV6}}); err != nil {
		t.Fatal(err)
	}
	return r
}

func (r *rig) close() {
	r.fwd.Close()
	if r.client != nil {
		r.client.Close()
	} else {
		r.clientDev.Close()
	}
	r.weir.Close()
}

// services returns a Services func answering for one virtual server.
func services(vs *policy.VirtualServer) func(netip.Addr, uint16) *policy.VirtualServer {
	return func(addr netip.Addr, port uint16) *policy.VirtualServer {
		for _, v := range vs.VIPs {
			if v == addr.Unmap() && vs.Ports.Contains(port) {
				return vs
			}
		}
		return nil
	}
}

// echoServer serves on a host loopback listener, echoing every connection,
// and closes after echoing when closeFirst (the target closes first).
func echoServer(t testing.TB, network, addr string) (netip.AddrPort, func()) {
	t.Helper()
	l, err := net.Listen(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	return l.Addr().(*net.TCPAddr).AddrPort(), func() { l.Close(); wg.Wait() }
}

// serveListener runs handle for every connection l accepts until l closes.
func serveListener(l net.Listener, handle func(net.Conn)) (stop func()) {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				handle(c)
			}()
		}
	}()
	return func() { l.Close(); wg.Wait() }
}

func dial(t testing.TB, s *Stack, addr netip.AddrPort) *Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := s.DialTCP(ctx, netip.AddrPort{}, addr)
	if err != nil {
		t.Fatalf("dial %v: %v", addr, err)
	}
	return c
}

// settleGoroutines waits until the goroutine count falls to at most want,
// and returns the last count seen.
func settleGoroutines(want int, within time.Duration) int {
	deadline := time.Now().Add(within)
	for {
		n := runtime.NumGoroutine()
		if n <= want || time.Now().After(deadline) {
			return n
		}
		time.Sleep(20 * time.Millisecond)
	}
}
