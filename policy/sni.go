package policy

// TLS passthrough routed by server name (SNI)
//
// Several tls services may share a VIP and port: weir reads the client's
// ClientHello (without terminating TLS) and the server name in it chooses
// the service, as HAProxy's req.ssl_sni, Envoy's server_names and Traefik's
// HostSNI do. Among the tls services on the connection's VIP and port
// (RouteSNI):
//
//   - a service naming the server name exactly wins;
//   - else one naming the wildcard of its first label ("*.example.com"
//     matches "www.example.com", not "example.com" nor "a.b.example.com",
//     as a certificate's wildcard does, RFC 6125 6.4.3);
//   - else the one with SNIDefault (also the service of a ClientHello
//     without a server name);
//   - else none: the connection is refused (RST).
//
// Compile refuses a name (or wildcard) two tls services on one VIP and port
// both claim, and two defaults there, so the answer never depends on file
// order; and any other service (tcp, http) sharing a port of a tls one.

import (
	"net/netip"
	"strconv"
	"strings"
)

// MaxSNINames bounds a service's SNI list.
const MaxSNINames = 1024

// compileSNI checks and normalises vs's server names.
func (c *Config) compileSNI(vs *VirtualServer, bad func(string, ...any)) {
	where := "virtual server " + strconv.Quote(vs.Name)
	if vs.Proto != ProtoTLS {
		if len(vs.SNI) > 0 || vs.SNIDefault {
			bad("%s: sni needs protocol tls", where)
		}
		return
	}
	if len(vs.SNI) == 0 && !vs.SNIDefault {
		bad("%s: protocol tls needs sni: server names, or default", where)
	}
	if len(vs.SNI) > MaxSNINames {
		bad("%s: %d sni names, at most %d", where, len(vs.SNI), MaxSNINames)
	}
	seen := make(map[string]bool, len(vs.SNI))
	for i, n := range vs.SNI {
		norm, ok := normalizeSNI(n)
		if !ok {
			bad("%s: sni %q is not a host name or a wildcard *.name", where, n)
			continue
		}
		if seen[norm] {
			bad("%s: sni %q given twice", where, n)
		}
		seen[norm] = true
		vs.SNI[i] = norm
	}
}

// normalizeSNI lower-cases a configured server name and drops a trailing
// dot; it reports whether the result is a host name (labels of letters,
// digits, '-' and '_') or "*." and one.
func normalizeSNI(n string) (string, bool) {
	n = strings.ToLower(strings.TrimSuffix(n, "."))
	host := strings.TrimPrefix(n, "*.")
	if host == "" || len(n) > 255 {
		return "", false
	}
	for _, label := range strings.Split(host, ".") {
		if label == "" || len(label) > 63 {
			return "", false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return "", false
			}
		}
	}
	return n, true
}

// sharedTLS checks two services whose ports overlap on vip: allowed only
// when both are tls with disjoint names and at most one default.
func sharedTLS(vip netip.Addr, o, vs *VirtualServer, bad func(string, ...any)) {
	if o.Proto != ProtoTLS || vs.Proto != ProtoTLS {
		if o.Proto == ProtoTLS || vs.Proto == ProtoTLS {
			bad("%v ports %v claimed by both %q (%v) and %q (%v): only tls services may share a port, routed by server name",
				vip, vs.Ports, o.Name, o.Proto, vs.Name, vs.Proto)
			return
		}
		bad("%v ports %v claimed by both %q and %q", vip, vs.Ports, o.Name, vs.Name)
		return
	}
	if o.SNIDefault && vs.SNIDefault {
		bad("%v ports %v: tls services %q and %q are both sni default", vip, vs.Ports, o.Name, vs.Name)
	}
	for _, n := range vs.SNI {
		for _, m := range o.SNI {
			if n == m {
				bad("%v ports %v: sni %q claimed by both %q and %q", vip, vs.Ports, n, o.Name, vs.Name)
			}
		}
	}
}

// RouteSNI returns the tls service on addr and port for the server name of
// a ClientHello (lower case, no trailing dot; "" when it has none), by the
// rules of this file's comment, or nil when none answers. It does not
// allocate.
func (c *Config) RouteSNI(addr netip.Addr, port uint16, serverName string) *VirtualServer {
	var wild, def *VirtualServer
	parent := ""
	if i := strings.IndexByte(serverName, '.'); i > 0 {
		parent = serverName[i+1:]
	}
	for _, vs := range c.byVIP[addr.Unmap()] {
		if vs.Proto != ProtoTLS || !vs.Ports.Contains(port) {
			continue
		}
		if vs.SNIDefault && def == nil {
			def = vs
		}
		if serverName == "" {
			continue
		}
		for _, n := range vs.SNI {
			if n == serverName {
				return vs
			}
			if wild == nil && parent != "" && len(n) == len(parent)+2 && n[0] == '*' && n[2:] == parent {
				wild = vs
			}
		}
	}
	if wild != nil {
		return wild
	}
	return def
}

// AnswersSNI reports whether vs, a tls service, answers a ClientHello with
// serverName (normalised; "" none) on its own: a name or wildcard of its
// matches, or it is a default. RouteSNI, which weighs the other services
// of the VIP and port, is what routes; this is for a caller that has vs
// alone.
func (vs *VirtualServer) AnswersSNI(serverName string) bool {
	if vs.Proto != ProtoTLS {
		return false
	}
	parent := ""
	if i := strings.IndexByte(serverName, '.'); i > 0 {
		parent = serverName[i+1:]
	}
	for _, n := range vs.SNI {
		if serverName != "" && (n == serverName || parent != "" && len(n) == len(parent)+2 && n[0] == '*' && n[2:] == parent) {
			return true
		}
	}
	return vs.SNIDefault
}
