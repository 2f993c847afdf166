package main

import (
	"fmt"
	"net/netip"
	"strings"

	"weir/cmd/weir/internal/appliance"
	"weir/policy"
)

// weir run's back arm
//
// A `via: netstack` target is dialed by weir's own gVisor stack, so that
// every segment of the target leg is measured (datapath.SegStats). weir run
// has one transport, the TUN, and the back arm uses it too: the back NIC
// has its own source addresses (--back-addr), weir routes them into the TUN,
// and the leg's packets leave through the TUN into the host's routing and
// come back the same way:
//
//	weir (back NIC, source 198.19.254.1) ─► TUN ─► host routing (forwarding)
//	      ─► target ─► reply to 198.19.254.1 ─► host route into the TUN ─► weir
//
// The default addresses come from the RFC 2544 benchmarking block
// 198.18.0.0/15 and the ULA space fd00::/8: neither is used by home or
// office LANs (192.168/16, 10/8, 172.16/12), by carrier-grade NAT or
// Tailscale (100.64/10), nor routed on the Internet; 198.19.254.0/24 also
// stays clear of 198.18.0.0/16, the range proxy tools' "fake-ip" modes
// hand out. Choose others with --back-addr when your network uses them.
//
// The host forwards between the TUN and the target's interface, so IPv4
// (and IPv6) forwarding must be on (sysctl net.ipv4.ip_forward=1). A target
// in the same host (a namespace, a container bridge) replies through the
// host's route into the TUN. A target on another host must route the back
// addresses back to this host, either with a route on the target (or its
// gateway):
//
//	ip route add 198.19.254.1/32 via <weir host address>
//
// or with source NAT on the weir host, whose connection tracking restores
// the back address on the replies before they are routed into the TUN:
//
//	nft add table ip weir
//	nft add chain ip weir post '{ type nat hook postrouting priority srcnat; }'
//	nft add rule ip weir post ip saddr 198.19.254.1 oifname "eth0" masquerade

// Default back-arm addresses, one per family (see the comment above).
var (
	defaultBackAddr4 = netip.MustParsePrefix("198.19.254.1/32")
	defaultBackAddr6 = netip.MustParsePrefix("fd57:6569:72ff::1/128")
)

// backAddrUsage is --back-addr's help text.
var backAddrUsage = "source `PREFIX` of the back arm that dials via: netstack targets through the TUN (repeatable; " +
	"default " + defaultBackAddr4.String() + " and " + defaultBackAddr6.String() + ", for the families the targets use); \"none\" turns the back arm off"

// backArm returns the back arm of weir run and the host routes that send
// its addresses into the TUN for cfg.
//
// The arm itself (a NIC of weir's own stack, with the --back-addr
// addresses, or both default ones) is always there unless --back-addr is
// none, whether or not cfg has a netstack target: weir's stack cannot gain
// a NIC the forwarder and the datapath engine were built without, and a
// reload that adds the first `via: netstack` target must find it (it used
// to get ErrNoBackArm on every dial). It is invisible to the host until its
// routes are installed: see backRoutes, which every reload recomputes.
func backArm(cfg *policy.Config, flags []string) ([]appliance.BackArm, []netip.Prefix, error) {
	var addrs []netip.Prefix
	switch {
	case len(flags) == 1 && strings.EqualFold(flags[0], "none"):
		return nil, nil, nil
	case len(flags) > 0:
		for _, s := range flags {
			p, err := netip.ParsePrefix(s)
			if err != nil {
				a, aerr := netip.ParseAddr(s)
				if aerr != nil {
					return nil, nil, fmt.Errorf("--back-addr %q: %w", s, err)
				}
				p = netip.PrefixFrom(a, a.BitLen())
			}
			addrs = append(addrs, netip.PrefixFrom(p.Addr().Unmap(), p.Bits()))
		}
	default:
		addrs = []netip.Prefix{defaultBackAddr4, defaultBackAddr6}
	}
	arms := []appliance.BackArm{{Name: "back", Addrs: addrs,
		Routes: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")}}}
	return arms, backRoutesFor(cfg, arms, len(flags) > 0), nil
}

// backRoutesFor returns the host routes that send the back arm's addresses
// into the TUN under cfg: for addresses given with --back-addr (explicit)
// all of them, as before; for the default ones only those of the families
// cfg's `via: netstack` targets use, so a configuration without one adds
// no route to the host.
func backRoutesFor(cfg *policy.Config, arms []appliance.BackArm, explicit bool) []netip.Prefix {
	v4, v6 := explicit, explicit
	for _, vs := range cfg.Services {
		for _, t := range vs.Targets {
			if t.Via == policy.DialNetstack {
				if t.Addr.Addr().Unmap().Is4() {
					v4 = true
				} else {
					v6 = true
				}
			}
		}
	}
	var routes []netip.Prefix
	for _, arm := range arms {
		for _, p := range arm.Addrs {
			if a := p.Addr(); (a.Is4() && v4) || (!a.Is4() && v6) {
				routes = append(routes, netip.PrefixFrom(a, a.BitLen()))
			}
		}
	}
	return routes
}
