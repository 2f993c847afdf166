package e2e

import (
	"syscall"
	"testing"
	"time"

	"weir/cmd/weir/api"
)

// TestE2EReloadAddsBackArm: a reload that adds the first `via: netstack`
// target finds the back arm up, and its host routes installed: every
// download after it is served by the new target through weir's own stack
// (it used to get ErrNoBackArm on every dial), and that leg is measured.
func TestE2EReloadAddsBackArm(t *testing.T) {
	w := startWeir(t, "backarm-before.yaml")
	tns := w.targetNS()
	w.bodyBackend(tns, "t1", "198.18.3.1:8081", 16<<10)
	w.bodyBackend(tns, "t2", "198.18.3.2:8082", 16<<10)
	if res := w.downloads(1, 4); res.OK != 4 || res.PerTarget["t1"] != 4 {
		t.Fatalf("before the reload: %+v, want 4 from t1", res)
	}
	w.writeConfig("backarm-after.yaml")
	w.signal(syscall.SIGHUP)
	st := w.waitStatus(5*time.Second, "reloaded", func(st api.Status) bool { return st.Generation == 2 })
	if st.ReloadError != nil {
		t.Fatalf("reload error: %+v", st.ReloadError)
	}
	res := w.downloads(2, 20)
	if res.OK != 20 || res.PerTarget["t2"] != 20 {
		t.Fatalf("after the reload: %+v, want 20 from t2 through the back arm", res)
	}
	// The legs went out through the back NIC, which was there before the
	// reload.
	before, after := backTx(st), backTx(w.status())
	if before < 0 || after < before+20*3 {
		t.Errorf("the back NIC sent %d packets before the downloads, %d after: want it there and 3 or more per connection", before, after)
	}
}

// backTx is the packets the back arm's NIC sent, -1 without one.
func backTx(st api.Status) int64 {
	for _, n := range st.NICs {
		if n.Name == "back" {
			return int64(n.TxPackets)
		}
	}
	return -1
}
