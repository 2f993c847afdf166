package appliance_test

import (
	"context"
	"testing"
	"time"

	"weir/bench"
	"weir/cmd/weir/internal/lab"
	"weir/datapath/fault"
	"weir/policy"
)

// TestMonitorOffReloadRestoresWeights: a reload that disables the monitor
// puts the balancer back on the configured weights at once; before, the
// last cut weights stayed for good (no sample applied weights any more).
func TestMonitorOffReloadRestoresWeights(t *testing.T) {
	cfg := lab.WebConfig([]int{10, 10}, nil)
	cfg.Monitor.Direction = policy.ToTarget // the loss is on uploads: weir's segments
	l := lab.Must(t, cfg, lab.Options{})
	l.Faults[policy.TargetKey{Service: "web", Target: "t2"}].SetRates(fault.Rates{Drop: 0.05}, fault.Rates{})
	res := bench.Load{Dial: l.Dial, Addr: "198.19.0.80:80", Clients: 4, Requests: 80, Upload: 64 << 10, Duration: 90 * time.Second, Timeout: 30 * time.Second}.Run(context.Background())
	if res.OK != 80 {
		t.Fatalf("load under loss: %+v", res)
	}
	l.App.SampleNow()
	effective := func() (eff, base int) {
		for _, tg := range l.App.Status().Services[0].Targets {
			if tg.Name == "t2" {
				return tg.Effective, tg.Weight
			}
		}
		t.Fatal("no t2 in /status")
		return 0, 0
	}
	if eff, base := effective(); eff >= base {
		t.Fatalf("lossy t2 not cut: effective %d of %d", eff, base)
	}
	off := lab.WebConfig([]int{10, 10}, nil)
	off.Monitor.Enabled = false
	if err := l.App.Reload(off); err != nil {
		t.Fatal(err)
	}
	if eff, base := effective(); eff != base {
		t.Errorf("after a reload with the monitor off: effective %d, want the configured %d", eff, base)
	}
}
