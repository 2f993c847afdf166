// Package netstack holds all of weir's gVisor code: the userspace TCP/IP stack
// built from an Options struct, the link endpoint that bridges a
// datapath.Device, GSO, the TIME_WAIT reopen, the listeners with SYN cookies
// and the accept path (Forwarder), the legs (Conn, HostConn) and the dialers
// to targets (host sockets and a second gVisor NIC) with their
// per-direction measurement (LegMeter). The Forwarder completes each
// client's handshake and hands the connection to a proxy.Handler: what
// happens to it then (admission, the splice, the samples, the HTTP proxy)
// is in netstack/proxy and netstack/proxy/http, which import no gVisor.
//
// Nothing outside netstack imports gVisor; tcpip.Error never leaves it.
//
// A front stack answering for virtual servers on a device, splicing to
// targets reached by host sockets or through a back arm:
//
//	front, _ := netstack.New(netstack.Options{})
//	front.AddNIC(tunDev, netstack.NICOptions{Promiscuous: true})
//	back, _ := netstack.New(netstack.Options{})
//	back.AddNIC(backDev, netstack.NICOptions{Addrs: []netip.Prefix{backAddr}})
//	px := proxy.New(proxy.Options{
//		Admitter: admission, // limits + balancer: Admit returns a proxy.Session
//		HTTP:     proxyhttp.New(proxyhttp.Options{RequestAdmitter: admission}), // http virtual servers, request by request
//		Host:     &netstack.HostDialer{},
//		Back:     &netstack.StackDialer{Stack: back},
//		Meter:    &netstack.LegMeter{Segments: engine.Segments},
//	})
//	fwd := netstack.NewForwarder(front, netstack.ForwarderOptions{
//		Services: cfg.TCPService, // (*policy.Config).TCPService
//		Handler:  px,
//	})
//	defer fwd.Close() // closes px
//	…
//	s := px.Sample() // every sampling interval: raw counters per target and per target and action
//
// Every drop is counted: LinkStats per NIC (malformed, queue full, too big),
// ForwarderStats (no service, SYNs after Close, in-flight limit, SYN
// cookies, handshake timeouts, TIME_WAIT reopens, UDP unreachable),
// StackStats; proxy.Stats counts what became of the connections handed over.
package netstack
