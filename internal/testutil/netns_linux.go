package testutil

import (
	"os"
	"testing"

	"weir/internal/netns"
)

// NetNS returns a new network namespace with its loopback up, closed when
// the test ends (package weir/internal/netns: run code in it with Do, dial
// and listen in it with Dial and Listen). It skips the test where the host
// cannot make one: not root, or no CAP_SYS_ADMIN.
func NetNS(t testing.TB) *netns.NS {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("skipping: the test needs root to create a network namespace")
	}
	ns, err := netns.New()
	if err != nil {
		t.Skipf("skipping: %v", err)
	}
	t.Cleanup(func() { ns.Close() })
	return ns
}

// EnterNetNS moves the test goroutine, locked to its OS thread, into a new
// network namespace for the rest of the test; a cleanup moves it back. Only
// the test goroutine is inside: goroutines it starts are not.
func EnterNetNS(t testing.TB) *netns.NS {
	t.Helper()
	ns := NetNS(t)
	leave, err := ns.Enter()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := leave(); err != nil {
			t.Error(err)
		}
	})
	return ns
}
