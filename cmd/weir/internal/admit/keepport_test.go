package admit

import (
	"net/netip"
	"testing"

	"weir/policy"
)

// TestKeepPort: a target whose address has port 0 is dialed at the port the
// client asked for, under its own name; another target is left as it is.
func TestKeepPort(t *testing.T) {
	keeps := &policy.Target{Name: "t1", Addr: netip.MustParseAddrPort("198.19.1.10:0")}
	got := keepPort(keeps, 8003)
	if got.Addr != netip.MustParseAddrPort("198.19.1.10:8003") || got.Name != "t1" {
		t.Errorf("keepPort = %v %q, want 198.19.1.10:8003 named t1", got.Addr, got.Name)
	}
	if keeps.Addr.Port() != 0 {
		t.Error("keepPort changed the configured target")
	}
	fixed := &policy.Target{Name: "t2", Addr: netip.MustParseAddrPort("198.19.1.11:9000")}
	if keepPort(fixed, 8003) != fixed || keepPort(nil, 1) != nil {
		t.Error("a target with a port is not left as it is")
	}
}
