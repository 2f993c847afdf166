//go:build linux

package e2e

import (
	"net"
	"strconv"
)

// ipVersion is one address family the end-to-end tests run over, as
// Envoy's getIpVersionsForTest: the client's VIP is 198.18.0.N or fd00::N
// (the same digits: the configs write both).
type ipVersion struct {
	name string
	v6   bool
}

func ipVersions() []ipVersion { return []ipVersion{{"ipv4", false}, {"ipv6", true}} }

// vip is VIP N's address and port in this family.
func (v ipVersion) vip(n, port int) string {
	if v.v6 {
		return net.JoinHostPort("fd00::"+strconv.Itoa(n), strconv.Itoa(port))
	}
	return net.JoinHostPort("198.18.0."+strconv.Itoa(n), strconv.Itoa(port))
}
