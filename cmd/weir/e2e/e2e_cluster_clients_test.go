//go:build linux

package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"weir/internal/testutil"
)

// clientsConfig is an http service whose clients may each have 2
// requests in flight, cluster-wide, over the three instances of the ECMP
// rig (the two %s the instance id).
const clientsConfig = `# e2e cluster instance %s
instance:
  recomputeInterval: 100ms
services:
  - name: web
    vips: [198.18.0.10]
    port: 80
    protocol: http
    limits:
      maxConnections: 50
      enforceConnections: true
    clientLimits:
      maxConnections: 2
      enforceConnections: true
    targets:
      - {name: t1, address: "198.18.3.1:8081", weight: 10, via: host}
      - {name: t2, address: "198.18.3.2:8082", weight: 10, via: host}
      - {name: t3, address: "198.18.3.3:8083", weight: 10, via: host}
cluster:
  redis: 198.18.3.100:6379
  name: e2e
  instance: %s
  leaseInterval: 200ms
  borrowTimeout: 100ms
`

// TestE2EClusterClientLimit: a client's limit of 2 requests in flight
// holds over three instances behind ECMP (issue 26 Deliver 3, the
// cluster-wide case). Client A sends 12 requests at once, each on a
// connection of its own (a new source port: ECMP spreads them over the
// instances), held at the backends: exactly 2 reach a backend and 10 get
// the 503 page naming the client, some of them from an instance that
// holds none of A's requests (the cluster-wide count refused them). Client
// B's 2 are served meanwhile. Once the held ones end and their counts are
// released in Redis, A's next 2 at once are served.
func TestE2EClusterClientLimit(t *testing.T) {
	hold := make(chan struct{})
	released := false
	release := func() {
		if !released {
			released = true
			close(hold)
		}
	}
	defer release()
	rg := newECMPRigWith(t, rigOptions{config: clientsConfig, hold: hold})
	if err := rg.router.Do(func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		for _, a := range []string{"198.18.5.1/32", "198.18.5.2/32"} {
			ad, _ := netlink.ParseAddr(a)
			if err := netlink.AddrAdd(lo, ad); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	rg.startInstances()
	from := func(src string) *http.Client {
		return &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{
			DisableKeepAlives: true,
			DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
				var c net.Conn
				err := rg.router.Do(func() (err error) {
					d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
					c, err = d.DialContext(ctx, network, addr)
					return err
				})
				return c, err
			},
		}}
	}
	type answer struct {
		status int
		body   string
		err    error
	}
	send := func(c *http.Client, n int, out chan<- answer, wg *sync.WaitGroup) {
		for i := range n {
			wg.Go(func() {
				resp, err := c.Get(fmt.Sprintf("http://198.18.0.10/r%d", i))
				if err != nil {
					out <- answer{err: err}
					return
				}
				b, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				out <- answer{status: resp.StatusCode, body: string(b), err: err}
			})
		}
	}
	a, b := from("198.18.5.1"), from("198.18.5.2")
	answers := make(chan answer, 16)
	var wg sync.WaitGroup
	send(a, 12, answers, &wg)
	var refused []string
	for len(refused) < 10 {
		select {
		case an := <-answers:
			if an.err != nil || an.status != http.StatusServiceUnavailable {
				t.Fatalf("A's request answered %d %v before 10 were refused (%d so far): its limit of 2 is not cluster-wide",
					an.status, an.err, len(refused))
			}
			refused = append(refused, an.body)
		case <-time.After(20 * time.Second):
			t.Fatalf("only %d of A's 12 requests refused, backend has %d", len(refused), rg.web.Cur())
		}
	}
	if !testutil.WithinEvery(10*time.Second, 10*time.Millisecond, func() bool { return rg.web.Cur() == 2 }) {
		t.Fatalf("%d of A's requests at the backends, want 2", rg.web.Cur())
	}
	clusterWide := 0
	for _, body := range refused {
		if !strings.Contains(body, "client 198.18.5.1: maxConnections 2 reached (") {
			t.Fatalf("a 503 page that does not name client A's limit:\n%s", body)
		}
		if strings.Contains(body, "cluster-wide") {
			clusterWide++
		}
	}
	if clusterWide == 0 {
		t.Fatalf("no refusal by the cluster-wide count (all 12 at one instance?):\n%s", refused[0])
	}
	bAnswers := make(chan answer, 2)
	var bwg sync.WaitGroup
	send(b, 2, bAnswers, &bwg)
	if !testutil.WithinEvery(10*time.Second, 10*time.Millisecond, func() bool { return rg.web.Cur() == 4 }) {
		t.Fatalf("client B's 2 requests not at the backends beside A's 2 (%d there)", rg.web.Cur())
	}
	release()
	wg.Wait()
	bwg.Wait()
	close(answers)
	for an := range answers {
		if an.err != nil || an.status != 200 {
			t.Fatalf("a held request of A: %d %v", an.status, an.err)
		}
	}
	for range 2 {
		if an := <-bAnswers; an.err != nil || an.status != 200 {
			t.Fatalf("a request of B: %d %v", an.status, an.err)
		}
	}
	// The released counts reach Redis just after the responses: wait for
	// that, not for time.
	rdb := rg.rdb()
	defer rdb.Close()
	if !testutil.WithinEvery(5*time.Second, 20*time.Millisecond, func() bool {
		for _, id := range []string{"w1", "w2", "w3"} {
			if n, err := rdb.HLen(context.Background(), "weir:{e2e}:clients:vs:web:"+id).Result(); err != nil || n != 0 {
				return false
			}
		}
		return true
	}) {
		t.Fatal("A's and B's released requests still counted in Redis")
	}
	again := make(chan answer, 2)
	var awg sync.WaitGroup
	send(a, 2, again, &awg)
	awg.Wait()
	for range 2 {
		if an := <-again; an.err != nil || an.status != 200 {
			t.Fatalf("A's request after its others ended: %d %v %s", an.status, an.err, an.body)
		}
	}
	t.Logf("A: 2 served, 10 refused (%d by the cluster-wide count); B: 2 served beside; then A's 2 served", clusterWide)
}
