// Package proxy holds the parts of an accepted connection's life that need
// no gVisor: today the warm goroutine pool (WarmPool), the streaming meter
// (StreamMeter, fed the time by its caller), the 503 page (Page503,
// Serve503) and the per-direction counts (DirSource, DirCounters,
// SegmentsFunc). The connection contract, the splice and the HTTP proxy
// are still in package netstack, which uses these.
//
// deps_test.go keeps proxy and every package below it free of gVisor and
// of the control plane's logging, file formats and flags.
package proxy
