package host

import (
	"net/netip"
	"os"
	"strings"
)

// The back arm (weir run's via: netstack dialer) sends its packets through
// the TUN into the host's routing: the host must forward them.

// ForwardingOff names the address families whose forwarding the host has
// off while the back arm has addresses of that family: the arm's packets
// would then never leave the host.
func ForwardingOff(routes []netip.Prefix) []string {
	var off []string
	check := func(fam, file string) {
		if b, err := os.ReadFile(file); err == nil && strings.TrimSpace(string(b)) == "0" {
			off = append(off, fam+" ("+file+")")
		}
	}
	v4, v6 := false, false
	for _, p := range routes {
		v4 = v4 || p.Addr().Is4()
		v6 = v6 || p.Addr().Is6()
	}
	if v4 {
		check("IPv4", "/proc/sys/net/ipv4/ip_forward")
	}
	if v6 {
		check("IPv6", "/proc/sys/net/ipv6/conf/all/forwarding")
	}
	return off
}
