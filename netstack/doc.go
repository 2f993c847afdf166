// Package netstack holds all of weir's gVisor code: the userspace TCP/IP stack
// built from an Options struct, the link endpoint that bridges a
// datapath.Device, the TCP forwarder with admission before the handshake, the
// dialers to targets (host sockets and a second gVisor NIC), the connection
// contract (Admitter and the sessions), the splice, the HTTP proxy and its
// target pool, and the per-connection statistics records. The parts that
// need no gVisor (the warm pool, the streaming meter, the 503 page, the
// per-direction counts) are in netstack/proxy.
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
//	fwd := netstack.NewForwarder(front, netstack.ForwarderOptions{
//		Services:        cfg.Service, // (*policy.Config).Service
//		Admitter:        admission,   // limits + balancer: Admit returns a proxy.Session
//		RequestAdmitter: admission,   // http virtual servers, request by request
//		Back:            &netstack.StackDialer{Stack: back},
//	})
//	defer fwd.Close()
//	…
//	s := fwd.Sample() // every sampling interval: raw counters per target and per target and action
//
// Every drop is counted: LinkStats per NIC (malformed, queue full, too big),
// ForwarderStats (no service, refused, in-flight limit, handshake timeouts,
// dial failures, aborted, TIME_WAIT reopens, UDP unreachable), StackStats.
package netstack
