package main

// The topology, three unnamed namespaces (internal/netns: they vanish with
// the harness, even a killed one):
//
//	client 198.18.10.2 ─veth─ 198.18.10.1 router 198.18.20.1 ─veth─ 198.18.20.2 server
//	                          (+ 198.18.10.3)               (+ 198.18.21.2)
//
// The router forwards (ip_forward); the client's and the server's default
// routes point at it. Paths through it:
//   - kernel: the client reaches the server at 198.18.20.2, routed by the
//     router's kernel;
//   - weir:   the client reaches the VIP 198.18.0.10, which weir routes into
//     its TUN; weir splices each connection to 198.18.20.5 (tcp; udp to
//     198.18.20.2);
//   - peer:   the client reaches the server's second address 198.18.21.2; a
//     policy rule in the router sends what the client sends there into the
//     peer's TUN, and the peer (a transparent TUN proxy such as tun2socks)
//     connects to it from the router itself;
//   - haproxy: the client reaches HAProxy at the router's 198.18.10.3, and
//     HAProxy connects to the server's third address, 198.18.20.4 (kproxy
//     too), which no weir captures.

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"

	"github.com/vishvananda/netlink"

	"weir/internal/netns"
)

const (
	clientAddr  = "198.18.10.2"
	routerCAddr = "198.18.10.1"
	routerSAddr = "198.18.20.1"
	routerHAddr = "198.18.10.3" // HAProxy's listening address
	serverAddr  = "198.18.20.2" // kernel path and weir's udp target
	// serverWeirAddr is weir's tcp targets' address: the server's own for
	// weir, so that weir's host-leg capture (which follows its targets'
	// addresses and ports) copies none of the other paths' packets. The
	// udp target stays serverAddr: iperf3's UDP server answers from the
	// address its route picks, which a relay connected elsewhere drops.
	serverWeirAddr = "198.18.20.5"
	serverPeerIP   = "198.18.21.2" // the peer's path
	// serverAltAddr is the server's second address, the -peer-weir weir's
	// target: weir's host-leg capture follows its own targets' addresses
	// and ports, so that neither weir tracks (and pays for) the other's legs.
	serverAltAddr = "198.18.20.3"
	// serverProxyAddr is the server's third address, the one HAProxy and
	// kproxy connect to: their legs are the router's own sockets, which
	// weir's capture would otherwise track (and keep, 3 s each, never
	// released) while they run, leaving weir's heap grown for its own.
	serverProxyAddr = "198.18.20.4"
	weirVIP         = "198.18.0.10"
	weirTUNAddr     = "198.18.0.1/32"
	weirTUN         = "bw0"
	peerTUN         = "bp0"
	peerTable       = 100

	iperfPort = 5201
	rrPort    = 7000

	rtrClientLink = "rc0" // router's end towards the client
	rtrServerLink = "rs0"
	clientLink    = "c0"
	serverLink    = "s0"
)

// topology holds the three namespaces.
type topology struct {
	client, router, server *netns.NS
}

// buildTopology makes the namespaces and wires them. On error it removes
// what it made.
func buildTopology() (t *topology, err error) {
	t = &topology{}
	defer func() {
		if err != nil {
			t.close()
			t = nil
		}
	}()
	for _, p := range []**netns.NS{&t.client, &t.router, &t.server} {
		if *p, err = netns.New(); err != nil {
			return t, err
		}
	}
	err = t.router.Do(func() error {
		for _, v := range []struct {
			local, peer string
			to          *netns.NS
		}{{rtrClientLink, clientLink, t.client}, {rtrServerLink, serverLink, t.server}} {
			la := netlink.NewLinkAttrs()
			la.Name = v.local
			if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: v.peer}); err != nil {
				return fmt.Errorf("veth %s: %w", v.local, err)
			}
			peer, err := netlink.LinkByName(v.peer)
			if err != nil {
				return err
			}
			if err := netlink.LinkSetNsFd(peer, v.to.FD()); err != nil {
				return fmt.Errorf("move %s: %w", v.peer, err)
			}
		}
		if err := linkUp(rtrClientLink, routerCAddr+"/24", routerHAddr+"/32"); err != nil {
			return err
		}
		if err := linkUp(rtrServerLink, routerSAddr+"/24"); err != nil {
			return err
		}
		if err := addRoute(serverPeerIP+"/32", serverAddr); err != nil {
			return err
		}
		// The peer's replies come out of its TUN with the server's address:
		// strict reverse-path filtering would drop them.
		return sysctls(map[string]string{
			"net/ipv4/ip_forward":             "1",
			"net/ipv4/conf/all/rp_filter":     "0",
			"net/ipv4/conf/default/rp_filter": "0",
		})
	})
	if err != nil {
		return t, fmt.Errorf("router: %w", err)
	}
	if err = t.client.Do(func() error {
		if err := linkUp(clientLink, clientAddr+"/24"); err != nil {
			return err
		}
		return addRoute("0.0.0.0/0", routerCAddr)
	}); err != nil {
		return t, fmt.Errorf("client: %w", err)
	}
	if err = t.server.Do(func() error {
		if err := linkUp(serverLink, serverAddr+"/24", serverPeerIP+"/32", serverAltAddr+"/32", serverProxyAddr+"/32", serverWeirAddr+"/32"); err != nil {
			return err
		}
		return addRoute("0.0.0.0/0", routerSAddr)
	}); err != nil {
		return t, fmt.Errorf("server: %w", err)
	}
	// Tens of thousands of short connections a second: TIME_WAIT would
	// exhaust the default ephemeral ports within seconds. Every namespace
	// opens connections (weir and the peer dial the server from the router).
	for _, ns := range []*netns.NS{t.client, t.router, t.server} {
		if err = ns.Do(func() error {
			return sysctls(map[string]string{
				"net/ipv4/ip_local_port_range": "1024 65535",
				"net/ipv4/tcp_tw_reuse":        "1",
			})
		}); err != nil {
			return t, err
		}
	}
	return t, nil
}

// close lets the namespaces go (they vanish once the processes in them have
// exited too).
func (t *topology) close() {
	for _, ns := range []*netns.NS{t.client, t.router, t.server} {
		if ns != nil {
			ns.Close()
		}
	}
}

// routePeer sends what the client sends to serverPeerIP into the peer's TUN
// (run inside the router once the peer has made its TUN).
func routePeer() error {
	link, err := netlink.LinkByName(peerTUN)
	if err != nil {
		return err
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return err
	}
	r := netlink.Route{LinkIndex: link.Attrs().Index, Dst: mustCIDR("0.0.0.0/0"), Table: peerTable}
	if err := netlink.RouteReplace(&r); err != nil {
		return fmt.Errorf("peer route: %w", err)
	}
	rule := netlink.NewRule()
	rule.IifName = rtrClientLink
	rule.Dst = mustCIDR(serverPeerIP + "/32")
	rule.Table = peerTable
	if err := netlink.RuleAdd(rule); err != nil {
		return fmt.Errorf("peer rule: %w", err)
	}
	return nil
}

func linkUp(name string, addrs ...string) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return err
	}
	for _, a := range addrs {
		addr, err := netlink.ParseAddr(a)
		if err != nil {
			return err
		}
		if err := netlink.AddrAdd(l, addr); err != nil {
			return fmt.Errorf("address %s on %s: %w", a, name, err)
		}
	}
	if err := netlink.LinkSetUp(l); err != nil {
		return fmt.Errorf("%s up: %w", name, err)
	}
	return nil
}

func addRoute(dst, via string) error {
	r := netlink.Route{Dst: mustCIDR(dst), Gw: net.ParseIP(via)}
	if err := netlink.RouteAdd(&r); err != nil {
		return fmt.Errorf("route %s via %s: %w", dst, via, err)
	}
	return nil
}

func mustCIDR(s string) *net.IPNet {
	_, n, err := net.ParseCIDR(s)
	if err != nil {
		panic(err)
	}
	return n
}

// sysctls writes net sysctls of the calling thread's namespace (/proc/sys/net
// is the opener's namespace's) and reads each back.
func sysctls(kv map[string]string) error {
	var errs []error
	for k, v := range kv {
		p := "/proc/sys/" + k
		if err := os.WriteFile(p, []byte(v), 0); err != nil {
			errs = append(errs, err)
			continue
		}
		got, err := os.ReadFile(p)
		if err != nil {
			errs = append(errs, err)
		} else if g := strings.Join(strings.Fields(string(got)), " "); g != v {
			errs = append(errs, fmt.Errorf("%s is %q after writing %q", k, g, v))
		}
	}
	return errors.Join(errs...)
}
