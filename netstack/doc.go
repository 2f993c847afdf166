// Package netstack holds all of weir's gVisor code: the userspace TCP/IP stack
// built from an Options struct, the link endpoint that bridges a
// datapath.Device, the TCP forwarder with admission before the handshake, the
// dialers to targets (host sockets and a second gVisor NIC), the splice, and
// the per-connection statistics records.
//
// Nothing outside netstack imports gVisor; tcpip.Error never leaves it.
package netstack
