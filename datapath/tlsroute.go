package datapath

// TLS flows routed by server name
//
// A SYN to a VIP and port that several tls services share is classified
// into the first of them (Config.Service): which one serves it is known
// only once the proxy has read the ClientHello (policy.Config.RouteSNI).
// Reroute then moves the flow to that service, as if its SYN had been
// classified into it: its policy action (rules naming the service), ToS
// mark and meter row become the routed service's from the next packet on.
// What came before (the handshake and the ClientHello, a few hundred
// bytes) stays counted in the first service's row. A config swap keeps
// the flow in its routed service, found again by name (rerouted).

import (
	"net/netip"

	"weir/policy"
)

// Reroute moves the live TCP flow between client and server (a VIP and
// port) to vs, the tls service its ClientHello routed it to, and returns
// the flow now in the table (nil when there is none). A flow already in
// vs, decided under an older config (its next packet decides it again,
// keeping vs: see rerouted), or that the table cannot hold again is
// returned as it is. The flow keeps its bound target, measurement and
// byte-count state.
func (e *Engine) Reroute(client, server netip.AddrPort, vs *policy.VirtualServer) *Flow {
	k := NewFlowKey(client, server, ProtoTCP)
	h := k.Hash()
	now := e.clock()
	f := e.flows.Lookup(&k, h, now)
	if f == nil || f.Service == vs || vs == nil {
		return f
	}
	st := e.state.Load()
	if _, ok := st.svcIdx[vs]; !ok || f.Gen != st.gen {
		return f
	}
	// A flow a PROXY header reclassified is decided for the client it
	// named (Reclassify), and stays so.
	dk := k
	if f.as != nil {
		dk = NewFlowKey(*f.as, server, ProtoTCP)
	}
	_, act, v := st.decideFor(&dk, vs)
	nf := &Flow{Key: k, Service: vs, Action: act, TOS: v.tos, SetTOS: v.setTOS, Gen: st.gen, Row: v.row}
	nf.seg, nf.as = f.seg, f.as
	for d := range nf.app {
		nf.app[d].w.Store(f.app[d].w.Load())
	}
	if f.half.Load() {
		nf.half.Store(true)
	}
	if e.flows.insert(nf, h, now, f.target.Load()) == nil {
		return f
	}
	return nf
}

// rerouted returns the service of st's config a flow that was in old
// keeps when decided again (decided is what its VIP and port give): old's
// namesake when old is a tls service other than decided's namesake and
// the namesake still serves k's VIP and port as tls; else nil.
func (st *engineState) rerouted(k *FlowKey, old, decided *policy.VirtualServer) *policy.VirtualServer {
	if old == nil || old.Proto != policy.ProtoTLS || decided == nil || decided.Proto != policy.ProtoTLS || old.Name == decided.Name {
		return nil
	}
	vs := st.cfg.ServiceByName(old.Name)
	if vs == nil || vs.Proto != policy.ProtoTLS {
		return nil
	}
	server := k.ServerAddrPort()
	if !vs.Ports.Contains(server.Port()) {
		return nil
	}
	for _, a := range vs.VIPs {
		if a.Unmap() == server.Addr().Unmap() {
			return vs
		}
	}
	return nil
}
