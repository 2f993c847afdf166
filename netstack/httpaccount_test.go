package netstack

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"weir/internal/testutil"
	"weir/netstack/proxy"
	"weir/policy"
)

// aggOf returns the aggregate of action (or the target's, "") in s.
func aggOf(s proxy.Sample, target, action string) (proxy.AggSample, bool) {
	list := s.Targets
	if action != "" {
		list = s.TargetActions
	}
	for _, a := range list {
		if a.Name == target && a.Action == action {
			return a, true
		}
	}
	return proxy.AggSample{}, false
}

// TestHTTPPooledConnBelongsToRequest (issue 22, N1 and N2): a gold
// request dials the one target connection, two silver requests reuse it
// from the pool. While it sits idle in the pool it is no level's active
// connection (N1: gold read 1 active connection after its request was
// done, so its connection fraction stayed up with nothing in flight), and
// the silver requests' bytes are silver's, not gold's (N2: the connection
// kept the action of the request that dialed it).
func TestHTTPPooledConnBelongsToRequest(t *testing.T) {
	r, adm, conns := httpRig(t, echoHeaders, policy.HTTPOptions{})
	gold, silver := &policy.Action{Name: "gold"}, &policy.Action{Name: "silver"}
	var n atomic.Int64
	adm.admit = func(*proxy.ConnRequest) proxy.Decision {
		act := silver
		if n.Add(1) == 1 {
			act = gold
		}
		return proxy.Decision{Verdict: proxy.Accept, Target: adm.target, Action: act}
	}
	vip := netip.AddrPortFrom(vipV4, 80)
	get := func(c *Conn, br *bufio.Reader, path string) {
		t.Helper()
		fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: x\r\n\r\n", path)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d", path, resp.StatusCode)
		}
	}
	// idle waits until the request's End and the target connection's
	// return to the pool (both follow the response).
	idle := func(ends int64) {
		t.Helper()
		if !testutil.Within(5*time.Second, func() bool {
			return adm.nEnds.Load() == ends && r.stats().TargetConnsIdle == 1
		}) {
			t.Fatalf("ends %d, idle target connections %d; want %d, 1", adm.nEnds.Load(), r.stats().TargetConnsIdle, ends)
		}
	}
	r.px.Sample()

	a := dial(t, r.client, vip)
	defer a.Close()
	a.SetDeadline(time.Now().Add(10 * time.Second))
	get(a, bufio.NewReader(a), "/gold")
	idle(1)
	s := r.px.Sample()
	g, ok := aggOf(s, "t1", "gold")
	if !ok || g.Bytes == 0 {
		t.Fatalf("gold aggregate %+v (found %v): want the gold request's bytes", g, ok)
	}
	if g.Active != 0 {
		t.Errorf("gold: %d active connections with no request in flight, want 0 (the pooled connection is no level's)", g.Active)
	}
	if tg, _ := aggOf(s, "t1", ""); tg.Active != 0 {
		t.Errorf("target t1: %d active connections with no request in flight, want 0", tg.Active)
	}

	b := dial(t, r.client, vip)
	defer b.Close()
	b.SetDeadline(time.Now().Add(10 * time.Second))
	bbr := bufio.NewReader(b)
	get(b, bbr, "/silver1")
	get(b, bbr, "/silver2")
	idle(3)
	if c := conns.Load(); c != 1 {
		t.Fatalf("%d target connections, want 1 (pooled, reused)", c)
	}
	s = r.px.Sample()
	sv, ok := aggOf(s, "t1", "silver")
	if !ok || sv.Bytes == 0 {
		t.Errorf("silver aggregate %+v (found %v): want the two silver requests' bytes", sv, ok)
	}
	if sv.Active != 0 {
		t.Errorf("silver: %d active connections with no request in flight, want 0", sv.Active)
	}
	if g, ok := aggOf(s, "t1", "gold"); ok && (g.Bytes != 0 || g.Active != 0) {
		t.Errorf("gold measured %d bytes and %d active connections of the silver requests", g.Bytes, g.Active)
	}
	tg, _ := aggOf(s, "t1", "")
	if tg.Bytes != sv.Bytes {
		t.Errorf("target t1 %d bytes, silver %d: the target's bytes are its requests'", tg.Bytes, sv.Bytes)
	}
	if cs := r.px.Conns(); len(cs) != 1 || cs[0].Action != "" {
		t.Errorf("connections %+v: want the one pooled target connection, under no action", cs)
	}
}

// meterConn counts the bytes a client reads and writes.
type meterConn struct {
	net.Conn
	in, out int64
}

func (m *meterConn) Read(b []byte) (int, error) {
	n, err := m.Conn.Read(b)
	m.in += int64(n)
	return n, err
}

func (m *meterConn) Write(b []byte) (int, error) {
	n, err := m.Conn.Write(b)
	m.out += int64(n)
	return n, err
}

// TestHTTPRequestBytesReported (issue 22, N3 and N4): each request that
// reaches a target reports exactly its bytes on the client connection (its
// head, the first request's too; its body; its response), and a refused
// request on the same keep-alive connection reports nothing, neither its
// head and body nor its 503 page.
func TestHTTPRequestBytesReported(t *testing.T) {
	big := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/big" {
			w.Write([]byte(strings.Repeat("B", 100<<10))) // chunked, over many reports
			return
		}
		echoHeaders(w, r)
	})
	r, adm, _ := httpRig(t, big, policy.HTTPOptions{})
	var n atomic.Int64
	adm.admit = func(*proxy.ConnRequest) proxy.Decision {
		if i := n.Add(1); i == 3 || i == 4 {
			return proxy.Decision{Verdict: proxy.Refuse503, Limit: "maxBandwidth", Value: 1000, Reason: "over"}
		}
		return proxy.Decision{Verdict: proxy.Accept, Target: adm.target}
	}
	c := dial(t, r.client, netip.AddrPortFrom(vipV4, 80))
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	mc := &meterConn{Conn: c}
	br := bufio.NewReader(mc)
	var want int64 // the admitted requests' bytes, both ways
	for i, req := range []string{
		"GET /1 HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET /2 HTTP/1.1\r\nHost: x\r\nX-Pad: " + strings.Repeat("p", 300) + "\r\n\r\n",
		"POST /3 HTTP/1.1\r\nHost: x\r\nContent-Length: 500\r\n\r\n" + strings.Repeat("r", 500),
		"GET /4 HTTP/1.1\r\nHost: x\r\n\r\n",
		"POST /5 HTTP/1.1\r\nHost: x\r\nContent-Length: 2000\r\n\r\n" + strings.Repeat("b", 2000),
		"POST /6 HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n400\r\n" + strings.Repeat("c", 1024) + "\r\n0\r\n\r\n",
		"GET /big HTTP/1.1\r\nHost: x\r\n\r\n",
	} {
		in, out := mc.in, mc.out
		io.WriteString(mc, req)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("request %d: %v", i+1, err)
		}
		io.Copy(io.Discard, resp.Body)
		refused := i+1 == 3 || i+1 == 4
		if want := map[bool]int{false: 200, true: 503}[refused]; resp.StatusCode != want {
			t.Fatalf("request %d: %d, want %d", i+1, resp.StatusCode, want)
		}
		if br.Buffered() != 0 {
			t.Fatalf("request %d: %d bytes beyond the response", i+1, br.Buffered())
		}
		if !refused {
			want += mc.in - in + mc.out - out
		}
	}
	if !testutil.Within(5*time.Second, func() bool { return adm.nEnds.Load() == 7 }) {
		t.Fatalf("%d request Ends, want 7", adm.nEnds.Load())
	}
	if got := adm.moved.Load(); got != want {
		t.Errorf("requests reported %d bytes, want %d: the five admitted requests' heads, bodies and responses, nothing of the two refused ones", got, want)
	}
	if w := adm.movedWire.Load(); w <= adm.moved.Load() {
		t.Errorf("wire bytes %d, payload %d: want the segments' headers on top", w, adm.moved.Load())
	}
	if a, b := adm.movedAfterEnd.Load(), adm.movedAfterRelease.Load(); a != 0 || b != 0 {
		t.Errorf("%d reports after a request's End, %d after its Released: the slot is given back before all of its bytes counted", a, b)
	}
}
