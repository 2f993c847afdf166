package hostleg

import (
	"net/netip"
	"strings"
	"testing"

	"weir/datapath/hostcap"
	"weir/internal/testutil"
	"weir/policy"
)

func TestMain(m *testing.M) { testutil.VerifyNoLeaks(m) }

func config(off bool) *policy.Config {
	return &policy.Config{Monitor: policy.Monitor{HostCaptureOff: off}, Services: []*policy.VirtualServer{{Name: "web", Targets: []*policy.Target{
		{Name: "h", Addr: netip.MustParseAddrPort("127.0.0.1:8080"), Via: policy.DialHost},
		{Name: "n", Addr: netip.MustParseAddrPort("198.18.3.1:80"), Via: policy.DialNetstack},
		{Name: "noport", Addr: netip.AddrPortFrom(netip.MustParseAddr("127.0.0.2"), 0), Via: policy.DialHost},
	}}}}
}

// TestTargets: only via: host targets with a port are captured.
func TestTargets(t *testing.T) {
	got := Targets(config(false))
	if len(got) != 1 || got[0] != netip.MustParseAddrPort("127.0.0.1:8080") {
		t.Errorf("Targets = %v, want [127.0.0.1:8080]", got)
	}
}

// TestNoCapture: without a capture every method is harmless and /status
// says why there is none.
func TestNoCapture(t *testing.T) {
	h := New(nil, "")
	cfg := config(false)
	if h.Capture() != nil || h.SetTargets(cfg) != nil || h.Lost() != 0 {
		t.Error("a Capture without a capture did something")
	}
	if st := h.Status(cfg); st.State != "off" || st.Reason != "no capture was opened" || st.Targets != 1 {
		t.Errorf("status %+v", st)
	}
	if st := New(nil, "cannot be opened: EPERM").Status(cfg); st.Reason != "cannot be opened: EPERM" {
		t.Errorf("status %+v keeps not the reason given", st)
	}
}

// TestCaptureOnAndOff: with a capture (AF_PACKET, root), /status says on
// under a config that captures and off under monitor.hostCapture: off; a
// fresh capture has lost nothing.
func TestCaptureOnAndOff(t *testing.T) {
	c, err := hostcap.Open(hostcap.Options{})
	if err != nil {
		t.Skipf("no host capture here (needs CAP_NET_RAW): %v", err)
	}
	defer c.Close()
	h := New(c, "")
	if err := h.SetTargets(config(false)); err != nil {
		t.Fatal(err)
	}
	if st := h.Status(config(false)); st.State != "on" || st.Reason != "" {
		t.Errorf("status %+v, want on", st)
	}
	if n := h.Lost(); n != 0 {
		t.Errorf("a fresh capture lost %d", n)
	}
	if err := h.SetTargets(config(true)); err != nil {
		t.Fatal(err)
	}
	if st := h.Status(config(true)); st.State != "off" || !strings.Contains(st.Reason, "hostCapture: off") {
		t.Errorf("status %+v, want off by the config", st)
	}
}
