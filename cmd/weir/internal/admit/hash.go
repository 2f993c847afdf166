package admit

import (
	"hash/fnv"
	"net/http"
	"net/netip"

	"weir/datapath"
	"weir/netstack/proxy"
	"weir/policy"
)

// pickHash is the hash Maglev maps to a target for a connection (r nil)
// or an http request r, by the service's hashBy: the 5-tuple's flow hash
// (the same on every instance: datapath.FlowKey.Hash), the client's
// address alone, or a header's or cookie's value; a request without the
// header or cookie, and a connection of an http service hashing by one,
// hash the client's address. Every form is deterministic, so instances
// with the same targets agree. When weir accepts a PROXY-protocol header
// from its clients, client is to be the address the header carries.
func pickHash(vs *policy.VirtualServer, client, vip netip.AddrPort, r *proxy.Request) uint64 {
	var by policy.HashBy
	if vs.HashBy != nil {
		by = *vs.HashBy
	}
	switch by.Kind {
	case policy.HashConnection:
		// A udp service's session key: the same 5-tuple, protocol 17.
		key := datapath.NewFlowKey(client, vip, vs.IPProto())
		return key.Hash()
	case policy.HashHeader:
		if r != nil {
			if v := r.Header.Get(by.Name); v != "" {
				return valueHash(v)
			}
		}
	case policy.HashCookie:
		if r != nil {
			if c, err := (&http.Request{Header: r.Header}).Cookie(by.Name); err == nil && c.Value != "" {
				return valueHash(c.Value)
			}
		}
	}
	// The client's address: its port and the VIP left out.
	key := datapath.NewFlowKey(netip.AddrPortFrom(client.Addr(), 0), netip.AddrPortFrom(netip.IPv6Unspecified(), 0), datapath.ProtoTCP)
	return key.Hash()
}

// valueHash hashes a header or cookie value: FNV-64a, then a finaliser
// (splitmix64's) so that close values spread over the Maglev table.
func valueHash(v string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(v))
	x := h.Sum64()
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}
