package admit

import "weir/policy"

// keepPort returns t, or for a target that keeps the client's port (its
// address has port 0) a copy of t dialed at the port the client asked for:
// the forwarder dials Decision.Target.Addr, and the copy keeps the name the
// counters and leases go by.
func keepPort(t *policy.Target, clientPort uint16) *policy.Target {
	if t == nil || !t.KeepsPort() {
		return t
	}
	c := *t
	c.Addr = t.DialAddr(clientPort)
	return &c
}
