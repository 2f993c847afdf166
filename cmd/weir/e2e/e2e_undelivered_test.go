package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"weir/bench"
	"weir/cmd/weir/api"
	"weir/internal/testutil"
)

// TestE2EUndeliveredHostLeg is TestUndeliveredRequestIsNotTheTargets on a
// host socket leg (the default dialer), the real binary: once the client's
// kept-alive connection has a pooled target connection, the router drops
// every packet toward the target; a POST on it is never acknowledged
// (TCP_INFO: unacked segments), so at firstByte the client gets a 502,
// weir_http_undelivered_total and bad_gateway read 1, and the target stays
// up: with the path healed the next client is served by it at once.
func TestE2EUndeliveredHostLeg(t *testing.T) {
	w := startWeir(t, "undelivered_host.yaml")
	router, tns := w.routedTargets()
	w.bodyBackend(tns, "t1", "198.18.3.1:8081", 100)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := w.ns.Dial(ctx, "tcp", "198.18.0.10:80")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(20 * time.Second))
	request := testutil.NewKeptAlive(t, c).Do
	if resp := request("GET / HTTP/1.1\r\nHost: x\r\n\r\n"); resp.StatusCode != 200 {
		t.Fatalf("first request: %d, want 200", resp.StatusCode)
	}
	w.waitStatus(5*time.Second, "the target connection pooled", func(st api.Status) bool { return st.Forwarder.TargetConnsIdle == 1 })
	nftIn(t, router, "add", "rule", "inet", "weirhost", "forw", "tcp", "dport", "8081", "counter", "drop")
	body := strings.Repeat("u", 4000)
	start := time.Now()
	resp := request(fmt.Sprintf("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", len(body), body))
	t.Logf("the undelivered request: %d after %v", resp.StatusCode, time.Since(start).Round(time.Millisecond))
	if resp.StatusCode != http.StatusBadGateway {
		t.Errorf("request the target never acknowledged: %d, want 502", resp.StatusCode)
	}
	if out := nftIn(t, router, "list", "chain", "inet", "weirhost", "forw"); strings.Contains(out, "packets 0 ") {
		t.Errorf("the rule dropped nothing: %s", out)
	}
	nftIn(t, router, "flush", "chain", "inet", "weirhost", "forw")
	st := w.status()
	tg := statusService(st, "web").Targets[0]
	if tg.Down || tg.Failed != 0 {
		t.Errorf("target down %v, failed %d: want up, no failure", tg.Down, tg.Failed)
	}
	if f := st.Forwarder; f.HTTPUndelivered != 1 || f.HTTPBadGateway != 1 || f.TargetTimedOut != 0 {
		t.Errorf("undelivered %d, bad gateway %d, target timeouts %d; want 1, 1, 0", f.HTTPUndelivered, f.HTTPBadGateway, f.TargetTimedOut)
	}
	res := bench.Load{Dial: w.ns.Dial, Addr: "198.18.0.10:80", Clients: 1, Requests: 2, Duration: 10 * time.Second}.Run(ctx)
	if res.OK != 2 || res.PerTarget["t1"] != 2 {
		t.Errorf("after the path healed: %+v, want 2 served by t1", res)
	}
}
