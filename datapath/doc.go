// Package datapath is weir's hot path between a transport and the userspace
// TCP/IP stack: the batch Device interface and its transports (TUN on water,
// an in-memory pair, pcap replay and recording, a fault-injecting wrapper),
// allocation-free header parsing, the flow table, per-core meters and the
// ToS/DSCP rewrite with an incremental checksum.
//
// Per packet it never allocates, never locks a lock shared between workers,
// never logs and never returns an error: a packet it cannot use is dropped
// and counted by reason.
//
// # Pieces
//
//   - Device (device.go): the wireguard-go-shaped batch contract every
//     transport implements. NewPipe (pipe.go) makes two connected in-memory
//     Devices; datapath/tun, datapath/pcapdev and datapath/fault hold the
//     others.
//   - Parse (parse.go) reads IPv4/IPv6 (options, extension headers,
//     fragments), TCP, UDP and ICMP into a Packet value, or returns a
//     DropReason.
//   - SetTOS (tos.go) rewrites the DSCP, keeping ECN, with an RFC 1624
//     checksum update.
//   - FlowTable (flow.go) caches each flow's decision (virtual server,
//     action, ToS, meter row, bound target): sharded, bounded, idle expiry,
//     lock-free lookups.
//   - Meters (meter.go) count packets and bytes per virtual server, class,
//     instance, action and target, each direction, in per-worker
//     cache-line-separated shards; their ServiceBytes totals are what
//     policy.Admission's bandwidth windows read (policy.ByteTotals).
//   - Engine (engine.go) is a Device wrapping a transport that runs all of
//     the above per packet; Engine.Worker and Engine.Attach give each worker
//     (or each TUN queue) its own Port and meter shard.
//
// # Use
//
//	client, inner := datapath.NewPipe(datapath.PipeOptions{})
//	eng := datapath.NewEngine(inner, cfg, datapath.EngineOptions{Workers: 2})
//	// the stack reads client traffic from eng.Worker(i) and writes replies
//	// to eng; eng.SetConfig(next) swaps policy without losing a counter.
//
// # Offload
//
// A TUN with virtio-net headers (IFF_VNET_HDR, GSO/GRO) fits behind Device
// unchanged: it splits super-packets into bufs inside Read, coalesces in
// Write, uses the bytes before offset for its header, and reports a larger
// BatchSize. The engine only ever sees whole IP packets.
//
// datapath imports the standard library, golang.org/x/sys, water, gopacket,
// netlink and policy (for the compiled rule tables). It must never import
// zerolog, a YAML or JSON library, flag, gVisor or netstack (deps_test.go).
package datapath
