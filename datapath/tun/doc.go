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
//	      blocking in the Go poller until a packet or Close
//	Write: one write(2) per packet; the kernel's queue never blocks us
//
// water reads one packet per system call, so BatchSize is 1. A TUN opened
// with IFF_VNET_HDR (virtio-net headers, GSO/GRO offload, as wireguard-go's
// tun package does) can replace this one without touching the engine: it
// would split super-packets into bufs inside Read, coalesce in Write, use
// the bytes before offset for the virtio header, and report a larger
// BatchSize.
//
// The interface is created in the network namespace of the calling OS
// thread; tests lock their goroutine to a thread inside a namespace they
// create. Route changes after Open need CAP_NET_ADMIN only (weir run keeps
// it when it drops its other privileges).
package tun
