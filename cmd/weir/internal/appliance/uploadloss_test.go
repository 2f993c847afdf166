package appliance_test

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"weir/bench"
	"weir/cmd/weir/internal/lab"
	"weir/datapath/fault"
	"weir/netstack"
	"weir/policy"
)

// TestUploadsUnderLoss is issue 23's upload-under-loss measurement, run on
// demand (WEIR_UPLOADS=2800 go test -run TestUploadsUnderLoss -v): that
// many 256 KiB uploads, 8 in parallel, through netstack to two targets
// that each lose 5 % of weir's segments. Every upload must be answered
// 200 and no target may fall silent past firstByte (8 s here, so that a
// stall shows in a run of a minute). WEIR_UPLOADS_RACK=off runs weir's
// stack without RACK. Measured on a loaded 2-core host: with RACK (the
// default), 2 firstByte timeouts in 6 × 2 800 uploads (about 4 000 to the
// lossy target), one of them gVisor's tail-loss-probe stall (764 bytes
// unacknowledged, RTO 20 ms, Outstanding 0, no timer armed: after a probe
// its sender armed the retransmission timer only while Outstanding > 0,
// which drifts to 0 under loss with SACK; third_party/patches/gvisor-0001
// arms it while anything is unacknowledged: 0 stalls in 5 × 2 800 uploads
// through two lossy targets, against 1 in each of 3 runs before it);
// without RACK no stalled sender, but firstByte timeouts of RTO backoff
// under an RTT the starved machine inflated to 0.5–0.8 s (RTO 3.2–3.7 s),
// which the default firstByte of 30 s absorbs. RACK stays the default:
// without it TestSYNFloodCookies failed 6 of 20 and TestE2EMeasureBackArm
// counted spurious RTOs (88 resends for 31 drops). The stall is bounded
// where the client sees it: a request its target has not acknowledged
// whole at firstByte is a 502 counted as undelivered, and the target is
// not blamed (no firstByte timeout, never marked down); the test allows
// those and fails on a request left unanswered or a target blamed.
func TestUploadsUnderLoss(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("WEIR_UPLOADS"))
	if n <= 0 {
		t.Skip("skipping: a measurement run on demand (WEIR_UPLOADS=2800)")
	}
	cfg := lab.WebConfig([]int{10, 10}, nil)
	cfg.Services[0].Timeouts = policy.Timeouts{FirstByte: 8 * time.Second}
	// A dial whose SYNs are all lost within timeouts.connect marks its
	// target down, and while both are down every new upload gets the 503
	// page (the client, still writing its body, sees its write fail). At
	// 5 % loss the default 3 s (a SYN and one resend) lose one dial in
	// 400, both targets down for 1 s in a 2 800-upload run: 373 of 800
	// failed that way. 10 s gives four SYNs (one in 160 000 lost), and a
	// target down still comes back at once.
	cfg.Instance.Timeouts.Connect = 10 * time.Second
	cfg.Balancer.RetryInterval = time.Second
	var o lab.Options
	if os.Getenv("WEIR_UPLOADS_RACK") == "off" {
		o.Appliance.Stack = netstack.Options{DisableRACK: true}
	}
	l := lab.Must(t, cfg, o)
	for _, tg := range []string{"t1", "t2"} {
		l.Faults[policy.TargetKey{Service: "web", Target: tg}].SetRates(fault.Rates{Drop: 0.05}, fault.Rates{})
	}
	t0 := time.Now()
	res := bench.Load{Dial: l.Dial, Addr: "198.19.0.80:80", Clients: 8, Requests: n, Upload: 256 << 10, Duration: time.Hour, Timeout: 20 * time.Second}.Run(context.Background())
	st := l.App.Status()
	f := st.Forwarder
	t.Logf("%d uploads in %v: %d OK, per target %v, 503 %d, failed %d; firstByte timeouts %d, undelivered (502) %d, bad gateway %d",
		n, time.Since(t0), res.OK, res.PerTarget, res.Refused503, res.Failed, f.TargetTimedOut, f.HTTPUndelivered, f.HTTPBadGateway)
	if res.OK+int(f.HTTPUndelivered) != n || f.HTTPBadGateway != f.HTTPUndelivered || f.TargetTimedOut != 0 || f.HTTPRefused != 0 {
		t.Errorf("%d of %d uploads OK and %d undelivered (502), %d bad gateway, %d firstByte timeouts: %v",
			res.OK, n, f.HTTPUndelivered, f.HTTPBadGateway, f.TargetTimedOut, res.Errors)
	}
}
