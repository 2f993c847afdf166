package admit

import (
	"fmt"
	"net/http"
	"net/netip"
	"testing"
	"time"

	"weir/balancer"
	"weir/netstack/proxy"
	"weir/policy"
)

var vip = netip.MustParseAddrPort("198.19.0.80:80")

// hashRig is a compiled maglev service of n targets hashing by by, and its
// balancer.
func hashRig(t *testing.T, n int, by string) (*policy.VirtualServer, *balancer.Balancer, *policy.Config) {
	t.Helper()
	h, err := policy.ParseHashBy(by)
	if err != nil {
		t.Fatal(err)
	}
	vs := &policy.VirtualServer{Name: "web", VIPs: []netip.Addr{vip.Addr()}, Ports: policy.PortRange{Lo: 80, Hi: 80}, Proto: policy.ProtoHTTP, HashBy: &h}
	for i := range n {
		vs.Targets = append(vs.Targets, &policy.Target{Name: fmt.Sprintf("t%d", i), Addr: netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 19, 1, byte(10 + i)}), 8080), Weight: 1})
	}
	cfg, err := policy.Compile(&policy.Config{Services: []*policy.VirtualServer{vs},
		Balancer: policy.BalancerSettings{Algorithm: policy.Maglev, Health: policy.HealthCheck{Interval: time.Second, Rise: 1, Fall: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	b := balancer.New(cfg.Services[0], cfg.Balancer)
	return cfg.Services[0], b, cfg
}

func pick(t *testing.T, b *balancer.Balancer, hash uint64) string {
	t.Helper()
	var tried balancer.Tried
	l, err := b.PickAction(time.Unix(0, 0), hash, nil, &tried)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	return l.Name()
}

func client(i, port int) netip.AddrPort {
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 18, byte(i >> 8), byte(i)}), uint16(port))
}

// TestHashByClient: 8 clients, 10 connections each from new source ports,
// hashBy client: each client sees one target; with one target down only
// that target's clients move. hashBy connection spreads one client's
// connections.
func TestHashByClient(t *testing.T) {
	vs, b, _ := hashRig(t, 4, "client")
	of := map[int]string{}
	for c := range 8 {
		for port := 40000; port < 40010; port++ {
			got := pick(t, b, pickHash(vs, client(c, port), vip, nil))
			if of[c] == "" {
				of[c] = got
			} else if got != of[c] {
				t.Fatalf("client %d: port %d reached %s, earlier ports %s", c, port, got, of[c])
			}
		}
	}
	gone := of[0]
	b.ReportHealth(gone, false, time.Unix(0, 0))
	moved := 0
	for c := range 8 {
		for port := 41000; port < 41010; port++ {
			got := pick(t, b, pickHash(vs, client(c, port), vip, nil))
			switch {
			case of[c] == gone && got == gone:
				t.Errorf("client %d still reaches %s, down", c, gone)
			case of[c] != gone && got != of[c]:
				t.Errorf("client %d moved from %s to %s though its target is up", c, of[c], got)
			}
			if got != of[c] && port == 41000 {
				moved++
			}
		}
	}
	t.Logf("8 clients on 4 targets %v; %s down: %d clients moved", of, gone, moved)

	vsConn, bConn, _ := hashRig(t, 4, "connection")
	seen := map[string]bool{}
	for port := 40000; port < 40010; port++ {
		seen[pick(t, bConn, pickHash(vsConn, client(0, port), vip, nil))] = true
	}
	if len(seen) < 2 {
		t.Errorf("hashBy connection: 10 source ports reached %v, want several targets", seen)
	}
}

// TestHashByHeaderAndCookie: requests with the same header (or cookie)
// value from different clients reach one target; without it a request
// hashes its client's address.
func TestHashByHeaderAndCookie(t *testing.T) {
	for _, by := range []string{"header:x-user", "cookie:session"} {
		t.Run(by, func(t *testing.T) {
			vs, b, _ := hashRig(t, 5, by)
			req := func(user string) *proxy.Request {
				h := http.Header{}
				if user != "" {
					if by == "header:x-user" {
						h.Set("X-User", user)
					} else {
						h.Set("Cookie", "theme=dark; session="+user)
					}
				}
				return &proxy.Request{Header: h}
			}
			targets := map[string]bool{}
			for u := range 20 {
				user := fmt.Sprintf("user-%d", u)
				first := ""
				for c := range 10 {
					got := pick(t, b, pickHash(vs, client(c, 50000+c), vip, req(user)))
					if first == "" {
						first = got
					} else if got != first {
						t.Fatalf("%s from client %d reached %s, from client 0 %s", user, c, got, first)
					}
				}
				targets[first] = true
			}
			if len(targets) < 3 {
				t.Errorf("20 users reached only %v of 5 targets", targets)
			}
			// No header or cookie: the client's address, whatever its port.
			if a, z := pickHash(vs, client(3, 1000), vip, req("")), pickHash(vs, client(3, 2000), vip, req("")); a != z {
				t.Errorf("without %s one client hashes %x and %x", by, a, z)
			}
			if pickHash(vs, client(3, 1000), vip, req("")) != pickHash(&policy.VirtualServer{HashBy: &policy.HashBy{Kind: policy.HashClient}}, client(3, 1), vip, nil) {
				t.Errorf("without %s a request does not hash as its client", by)
			}
		})
	}
}

// TestHashByClientMaglevDisruption: the share of 20000 clients that move
// when one of 10 targets leaves (removed by a reload) is ≈ 1/10: its own
// clients, and few others.
func TestHashByClientMaglevDisruption(t *testing.T) {
	const n, clients = 10, 20000
	vs, b, cfg := hashRig(t, n, "client")
	before := make([]string, clients)
	for c := range clients {
		before[c] = pick(t, b, pickHash(vs, client(c, 1), vip, nil))
	}
	for _, gone := range []int{0, 7} {
		name := vs.Targets[gone].Name
		rest := *vs
		rest.Targets = append(append([]*policy.Target{}, vs.Targets[:gone]...), vs.Targets[gone+1:]...)
		b.Update(&rest, cfg.Balancer)
		own, others := 0, 0
		for c := range clients {
			got := pick(t, b, pickHash(vs, client(c, 1), vip, nil))
			switch {
			case before[c] == name:
				own++
			case got != before[c]:
				others++
			}
		}
		moved := float64(own+others) / clients
		t.Logf("%s of %d leaves: %.2f %% of clients move (its own %.2f %%, others %.2f %%; 1/N = %.0f %%)",
			name, n, 100*moved, 100*float64(own)/clients, 100*float64(others)/clients, 100.0/n)
		if moved < 0.5/n || moved > 1.5/n || float64(others)/clients > 0.02 {
			t.Errorf("%.2f %% moved (others %.2f %%), want ≈ %.0f %% with others ≤ 2 %%", 100*moved, 100*float64(others)/clients, 100.0/n)
		}
		b.Update(vs, cfg.Balancer)
	}
}
