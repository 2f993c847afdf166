package health

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"weir/netstack/proxy/proxyproto"
	"weir/policy"
)

// acceptProxy serves as a target with accept-proxy does: a connection must
// start with a PROXY-protocol header (either version) or it is closed;
// then an http request gets 200, anything else is echoed. got hears each
// header read.
func acceptProxy(got chan<- proxyproto.Header) func(net.Conn) {
	return func(c net.Conn) {
		defer c.Close()
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		br := bufio.NewReader(c)
		h, err := proxyproto.Read(br, proxyproto.Any)
		if err != nil {
			return
		}
		got <- h
		b, err := br.Peek(3)
		if err == nil && string(b) == "GET" {
			if req, err := http.ReadRequest(br); err == nil {
				req.Body.Close()
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
			}
			return
		}
		io.Copy(c, br)
	}
}

// TestCheckSendsLocalHeader: a target with proxyProtocol is checked as its
// traffic goes: the check writes the address-less header of the target's
// version first (v2 LOCAL, v1 UNKNOWN), before an http or send/expect
// probe and on a connect-only check too. The same target checked without
// proxyProtocol fails (it closes a connection with no header).
func TestCheckSendsLocalHeader(t *testing.T) {
	got := make(chan proxyproto.Header, 16)
	addr := rawServer(t, acceptProxy(got))
	probes := map[string]*policy.HealthCheck{
		"connect":     {Interval: time.Second, Timeout: 2 * time.Second},
		"http":        {Interval: time.Second, Timeout: 2 * time.Second, HTTP: &policy.HTTPCheck{Method: "GET", Path: "/", Status: policy.StatusRange{Lo: 200, Hi: 399}}},
		"send/expect": {Interval: time.Second, Timeout: 2 * time.Second, Send: "PING\n", Expect: "PING\n"},
	}
	for _, v := range []policy.ProxyProtocol{policy.ProxyV1, policy.ProxyV2} {
		for name, h := range probes {
			r := Check(context.Background(), Target{Name: "a", Addr: addr, ProxyProtocol: v}, h)
			if !r.OK {
				t.Errorf("%v %s: %+v, want passing", v, name, r)
				continue
			}
			select {
			case hdr := <-got:
				if hdr.Version != proxyproto.Version(v) || !hdr.Local {
					t.Errorf("%v %s: header %+v, want an address-less %v one", v, name, hdr, v)
				}
			case <-time.After(5 * time.Second):
				t.Errorf("%v %s: the target read no header", v, name)
			}
		}
	}
	for _, name := range []string{"http", "send/expect"} {
		if r := Check(context.Background(), Target{Name: "a", Addr: addr}, probes[name]); r.OK {
			t.Errorf("%s without proxyProtocol passed a target that wants the header", name)
		}
	}
}
