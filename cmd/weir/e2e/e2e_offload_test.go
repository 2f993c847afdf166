//go:build linux

package e2e

import (
	"context"
	"testing"
	"time"
	"weir/internal/testutil"
)

// TestE2EOffload: weir run --offload on moves the front TUN to virtio-net
// headers and GSO (logged as offload_active), --offload off keeps the
// water device; either way 4 MiB each way through the marked service come
// back intact. The offload datapath itself (ToS on every segment, exact
// meters) is netstack's TestOffloadTUN.
func TestE2EOffload(t *testing.T) {
	for _, mode := range []string{"on", "off"} {
		t.Run(mode, func(t *testing.T) {
			w := startWeir(t, "tos.yaml", "--offload", mode)
			l, ok := w.waitLog(5*time.Second, "weir running")
			if !ok {
				t.Fatalf("no start line in the log:\n%s", w.Log())
			}
			if l.m["offload"] != mode || l.m["offload_active"] != (mode == "on") {
				t.Errorf("start line: offload %v, offload_active %v; want %s, %v", l.m["offload"], l.m["offload_active"], mode, mode == "on")
			}
			if st := w.status(); st.TUN == nil || st.TUN.Offload != (mode == "on") {
				t.Errorf("/status tun: %+v; want offload %v", st.TUN, mode == "on")
			}
			w.echo("198.18.1.3:2323")
			for _, vip := range []string{"198.18.0.23:23", "[fd00::23]:23"} {
				start := time.Now()
				echoTransfer(t, w, vip, 4<<20)
				t.Logf("%s: 4 MiB each way in %v", vip, time.Since(start))
			}
		})
	}
}

// echoTransfer sends n pseudo-random bytes to addr's echo while it reads
// them back, and fails unless all return intact.
func echoTransfer(t *testing.T, w *weirProc, addr string, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := w.ns.Dial(ctx, "tcp", addr)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	testutil.EchoTransfer(t, c, addr, n)
}
