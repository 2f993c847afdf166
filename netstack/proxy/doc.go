// Package proxy holds the life of an accepted connection, none of it
// gVisor's: weir/netstack accepts (handshake first) and hands each
// established connection to a Handler; Proxy is weir's. It asks the
// Admitter (the connection contract: ConnRequest, Decision, Session), dials
// the target through a Dialer, splices the two legs (splice.go) and
// releases the connection on the client's FIN (release.go), or answers
// with the 503 page (Page503, Serve503) or a RST. It measures every target
// connection for Sample and Conns (stats.go: the per-connection samples,
// the streaming meter StreamMeter, the per-direction counts DirCounters
// from a LegMeter), on its own clock (Options.Now). Connections of http
// virtual servers go to a RequestServer (netstack/proxy/http), which keeps
// its target connections as Targets (target.go). Goroutines are reused
// through a WarmPool.
//
// deps_test.go keeps proxy and every package below it free of gVisor and
// of the control plane's logging, file formats and flags.
package proxy
