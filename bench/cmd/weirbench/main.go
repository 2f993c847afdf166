// Command weirbench is weir's side-by-side end-to-end benchmark (`make
// bench-e2e`, root). It builds three network namespaces, client → router →
// server, and measures in one run, interleaved and repeated:
//
//   - the kernel: the router's kernel forwards between client and server;
//   - weir: the real `weir run` in the router, its TUN carrying a VIP whose
//     target is the server;
//   - HAProxy (on unless -haproxy=false): Debian's haproxy in the router,
//     `mode tcp`, its defaults, the yardstick every figure is also a ratio
//     to (haproxy.go);
//   - a peer (PEER_CMD, optional): any other TUN appliance in the router.
//
// Each path runs iperf3 (1 stream, 4 streams, reverse), iperf3 -u (one UDP
// stream through weir's udp service; HAProxy's cell says it has no UDP:
// udp.go) and a connection-rate load (connect → request → response → close at
// concurrency 1 and 16, the client or the server closing first), and the
// appliance's CPU seconds and peak RSS are read from /proc. The figures go
// out as a Markdown table and JSON (bench/out/bench-e2e.md and .json), every
// figure a median with its spread and a ratio to the kernel's and to
// HAProxy's.
//
//	sudo bin/weirbench -weir bin/weir
//	sudo PEER_CMD='tun2socks -device tun://$BENCH_TUN -proxy direct://' bin/weirbench
//
// The peer contract: PEER_CMD runs under /bin/sh in the router namespace
// with BENCH_TUN set to the TUN name it must create; the harness brings that
// TUN up and routes into it what the client sends to 198.18.21.2, and the
// peer must connect each such connection to its original destination.
//
// `weirbench connrate` and `weirbench rrserver` are the load's two ends,
// which the harness starts in the client and the server namespaces;
// `weirbench hold` holds the idle connections of the idle measurement;
// `weirbench kproxy` is the kernel-socket proxy of -kproxy (kproxy.go).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	var err error
	args := os.Args[1:]
	switch {
	case len(args) > 0 && args[0] == "connrate":
		err = connRateMain(args[1:])
	case len(args) > 0 && args[0] == "hold":
		err = holdMain(args[1:])
	case len(args) > 0 && args[0] == "rrserver":
		err = rrServerMain(args[1:])
	case len(args) > 0 && args[0] == "kproxy":
		err = kproxyMain(args[1:])
	default:
		err = benchMain(args)
	}
	if err != nil {
		var skip *skipError
		if errors.As(err, &skip) {
			fmt.Fprintln(os.Stderr, "weirbench:", err)
			os.Exit(3)
		}
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "weirbench:", err)
		}
		os.Exit(1)
	}
}

// skipError says the harness cannot run here (no root, no iperf3, no TUN);
// it exits 3 so that a caller can tell "cannot run" from "failed".
type skipError struct{ why string }

func (e *skipError) Error() string { return e.why }

func newFlagSet(name string) *flag.FlagSet {
	return flag.NewFlagSet("weirbench "+name, flag.ContinueOnError)
}

// signalContext ends on SIGINT or SIGTERM.
func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
}
