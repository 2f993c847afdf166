// Package tun is weir's Linux TUN transport: a datapath.Device per queue of
// a TUN interface opened with songgao/water and configured (MTU,
// txqueuelen, addresses, routes, link up) through netlink, never by running
// ip(8).
//
// Flow
//
//	Open: water.New per queue (IFF_MULTI_QUEUE when Queues > 1) ─► netlink:
//	      MTU, txqueuelen, addresses, up, routes
//	SyncRoutes / SyncVIPs (each reload): the routes through the interface
//	      become exactly the config's VIPs, on the netlink socket Open made
//	      in the interface's namespace
//	TUNStats (control plane): this queue's counters and the kernel's link
//	      counters (drops before weir read a packet, refused writes)
//	Read: one read(2) per call on the queue's file (water does no batching),
//	      blocking in the Go poller until a packet or Close; an offload
//	      queue reads until the batch is full or the queue empty
//	Write: one write(2) per packet (an offload queue's may be a 64 KiB
//	      super-packet); the kernel's queue never blocks us
//
// water reads one packet per system call, so such a queue's BatchSize is
// 1. With Options.Offload a queue is opened with IFF_VNET_HDR and
// TUNSETOFFLOAD instead (offload_linux.go): the kernel hands over TCP
// super-packets of up to 64 KiB and takes them back, each with its
// virtio-net header in the bytes before offset (datapath.Offloader), and a
// Read returns up to 64 of them from one wake-up of the poller.
//
// The interface is created in the network namespace of the calling OS
// thread; tests lock their goroutine to a thread inside a namespace they
// create. Route changes after Open need CAP_NET_ADMIN only (weir run keeps
// it when it drops its other privileges).
package tun
