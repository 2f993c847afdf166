// Package e2e is the end-to-end suite of the weir binary, apart from its
// unit tests (as tailscale's tstest/integration): each test builds
// cmd/weir once (weirBinary), starts `weir run` in a network namespace of
// its own (weirproc.Start), serves real backends there and drives kernel
// TCP clients through the VIPs weir routes into its TUN.
//
// The tests need root and /dev/net/tun and skip with a message without
// them; in -short mode (make test) they all skip. make e2e runs the suite
// and the demo over a TUN; make soak runs the long, timing-bound ones
// (the in-memory demo, the MinRate, measurement and cluster scenarios),
// which make e2e leaves out.
package e2e
