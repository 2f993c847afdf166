package main

import (
	"github.com/rs/zerolog"

	"weir/datapath/hostcap"
	"weir/policy"
)

// openHostCapture opens the capture that measures the via: host target
// legs (datapath/hostcap), unless monitor.hostCapture is off. It runs
// before weir drops its privileges: the AF_PACKET socket needs
// CAP_NET_RAW, which weir does not keep; its filter, set on every reload,
// needs none. It is opened whatever the targets, so that a reload that
// adds the first via: host target is measured too (with no host target
// its filter keeps nothing). When it cannot be opened, weir runs on and
// says so here and in /status (host_capture): the host legs' from_target
// is then TCP_INFO's estimate.
func openHostCapture(log *zerolog.Logger, cfg *policy.Config) (*hostcap.Capture, string) {
	if cfg.Monitor.HostCaptureOff {
		return nil, "monitor.hostCapture: off at start (a reload cannot turn it on: the socket needs CAP_NET_RAW, which weir drops)"
	}
	c, err := hostcap.Open(hostcap.Options{})
	if err != nil {
		log.Warn().Err(err).Msg("host capture: cannot be opened, so the via: host legs' from_target is only TCP_INFO's estimate " +
			"(no retransmission count; the monitor reads to_target instead). Run weir with CAP_NET_RAW, or set monitor.hostCapture: off to silence this")
		return nil, "cannot be opened: " + err.Error()
	}
	return c, ""
}
