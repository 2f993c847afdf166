package admit_test

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"weir/cmd/weir/internal/appliance"
	"weir/cmd/weir/internal/lab"
	"weir/cmd/weir/internal/obs"
	"weir/internal/testutil"
	"weir/netstack/proxy/proxyproto"
	"weir/policy"
)

// TestProxyProtocolHashByClientAndAccessLog: behind a trusted load
// balancer (the lab's client address sends every connection), hashBy
// client hashes the client each PROXY-protocol header names: 8 clients, 5
// connections each from new ports, each client's requests reach one
// target, and the clients spread over several (hashing the load
// balancer's one address would send all to one). Each request's
// access-log line names the header's client and the load balancer as
// proxy.
func TestProxyProtocolHashByClientAndAccessLog(t *testing.T) {
	cfg := lab.WebConfig([]int{1, 1, 1, 1}, nil)
	cfg.Balancer.Algorithm = policy.Maglev
	vs := cfg.Services[0]
	vs.HashBy = &policy.HashBy{Kind: policy.HashClient}
	vs.AcceptProxy, vs.TrustedProxies = policy.ProxyV2, []netip.Prefix{netip.MustParsePrefix("198.18.0.2/32")}
	var accessBuf testutil.SyncBuffer
	access := obs.NewAccessLog(&accessBuf, false)
	l := lab.Must(t, cfg, lab.Options{Appliance: appliance.Options{Access: access}})
	vip := netip.MustParseAddrPort("198.19.0.80:80")
	seen := map[string]map[string]bool{} // client → targets
	all := map[string]bool{}
	for i := range 8 {
		client := netip.AddrFrom4([4]byte{198, 19, 50, byte(1 + i)})
		seen[client.String()] = map[string]bool{}
		for j := range 5 {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			c, err := l.Dial(ctx, "tcp", vip.String())
			cancel()
			if err != nil {
				t.Fatal(err)
			}
			c.SetDeadline(time.Now().Add(10 * time.Second))
			hdr := proxyproto.AppendV2(nil, netip.AddrPortFrom(client, uint16(20000+j)), vip)
			io.WriteString(c, string(hdr)+"GET / HTTP/1.1\r\nHost: web\r\nConnection: close\r\n\r\n")
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatalf("client %v, connection %d: %v", client, j, err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			c.Close()
			tg := resp.Header.Get("X-Weir-Target")
			if resp.StatusCode != 200 || tg == "" {
				t.Fatalf("client %v: status %d, target %q", client, resp.StatusCode, tg)
			}
			seen[client.String()][tg] = true
			all[tg] = true
		}
	}
	for c, tgs := range seen {
		if len(tgs) != 1 {
			t.Errorf("client %s reached %d targets %v, want one", c, len(tgs), tgs)
		}
	}
	if len(all) < 2 {
		t.Errorf("8 clients all reached %v: hashed by the load balancer's address, not the header's", all)
	}
	t.Logf("8 clients over %d of 4 targets: %v", len(all), seen)
	waitClosed(t, l.App)
	access.Flush()
	logged := 0
	for _, line := range strings.Split(strings.TrimSpace(accessBuf.String()), "\n") {
		if strings.Contains(line, `"client":"198.19.50.`) && strings.Contains(line, `"proxy":"198.18.0.2:`) {
			logged++
		}
	}
	if logged != 40 {
		t.Errorf("%d access-log lines name a header's client and the proxy, want 40:\n%s", logged, accessBuf.String())
	}
}
