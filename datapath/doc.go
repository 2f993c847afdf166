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
// datapath imports the standard library, golang.org/x/sys, water, gopacket,
// netlink and policy (for the compiled rule tables). It must never import
// zerolog, a YAML or JSON library, flag, gVisor or netstack (deps_test.go).
package datapath
