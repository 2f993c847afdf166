//go:build linux

package e2e

import (
	"os/exec"
	"strings"
	"testing"
	"time"

	"weir/cmd/weir/api"
)

// TestE2EStatusAgreesWithMetrics: the real `weir run` serves one document
// three ways. After ten connections, /metrics carries /status's numbers,
// the front NIC over the TUN has the TUN's own counters, and `weir status`
// prints the same targets.
func TestE2EStatusAgreesWithMetrics(t *testing.T) {
	w := startWeir(t, "metrics.yaml")
	w.backend("t1", "198.18.1.1:8081", 0)
	if res := w.load("198.18.0.10:80", 2, 10); res.OK != 10 {
		t.Fatalf("load: %+v", res)
	}
	w.waitStatus(3*time.Second, "every connection closed", func(st api.Status) bool { return st.Open == 0 })
	st := w.status()
	fams := w.metrics()
	web := statusService(st, "web")
	if web == nil || len(web.Targets) != 1 {
		t.Fatalf("/status service web: %+v", web)
	}
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   uint64
	}{
		{"weir_connections_closed_total", nil, st.Closed},
		{"weir_connections_accepted_total", nil, st.Forwarder.Accepted},
		{"weir_target_picked_total", map[string]string{"service": "web", "target": "t1"}, web.Targets[0].Picked},
		{"weir_reloads_total", nil, st.Reloads},
	} {
		if got := metricSum(fams, c.name, c.labels); got != float64(c.want) || c.want == 0 && c.name != "weir_reloads_total" {
			t.Errorf("%s%v = %v, /status says %d", c.name, c.labels, got, c.want)
		}
	}
	if len(st.NICs) == 0 || st.NICs[0].Name != "front" || st.NICs[0].RxPackets == 0 || st.NICs[0].Device == nil {
		t.Errorf("/status nics %+v, want the front NIC first, with traffic and the TUN's own counters", st.NICs)
	}
	if metricSum(fams, "weir_transport_dropped_total", map[string]string{"nic": "front", "reason": "queue_full"}) < 0 {
		t.Error("no weir_transport_dropped_total for the TUN")
	}
	if st.TUN == nil || st.TUN.Name == "" {
		t.Errorf("/status tun %+v, want the TUN interface's kernel counters", st.TUN)
	} else if metricSum(fams, "weir_tun_kernel_dropped_total", map[string]string{"tun": st.TUN.Name, "direction": "to_weir"}) != float64(st.TUN.ToWeirDropped) {
		t.Errorf("weir_tun_kernel_dropped_total{to_weir} disagrees with /status %+v", st.TUN)
	}
	// weir status runs in weir's namespace, where the admin API listens.
	var out []byte
	if err := w.ns.Do(func() error {
		var err error
		out, err = exec.Command(weirBinary(t), "status", "--addr", w.Admin).CombinedOutput()
		return err
	}); err != nil {
		t.Fatalf("weir status: %v\n%s", err, out)
	}
	if s := string(out); !strings.Contains(s, "web (http") || !strings.Contains(s, "  t1 ") {
		t.Errorf("weir status:\n%s", s)
	}
	// weir run serves the status page and its history.
	for path, want := range map[string]string{"/ui": `<div id="charts"`, "/history": `"capacity": 720`} {
		code, body, err := w.Get(path)
		if err != nil || code != 200 || !strings.Contains(string(body), want) {
			t.Errorf("GET %s: %d %v, body lacks %q:\n%.300s", path, code, err, want, body)
		}
	}
}
