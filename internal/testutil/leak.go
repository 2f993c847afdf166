package testutil

import (
	"testing"

	"go.uber.org/goleak"
)

// VerifyNoLeaks runs a package's tests and then fails the binary if any
// goroutine they started is still running (go.uber.org/goleak). Call it from
// TestMain in packages that start goroutines:
//
//	func TestMain(m *testing.M) { testutil.VerifyNoLeaks(m) }
//
// extra adds goleak options (IgnoreTopFunction for a library's own
// long-lived goroutines, with a comment saying whose and why).
func VerifyNoLeaks(m *testing.M, extra ...goleak.Option) {
	goleak.VerifyTestMain(m, extra...)
}

// CheckNoLeaks fails t if goroutines started since the snapshot opts were
// taken with (goleak.IgnoreCurrent()) are still running once the test's
// cleanups ran; goleak retries for a while, so a goroutine on its way out
// is not reported.
func CheckNoLeaks(t testing.TB, extra ...goleak.Option) {
	t.Helper()
	opts := append([]goleak.Option{goleak.IgnoreCurrent()}, extra...)
	t.Cleanup(func() { goleak.VerifyNone(t, opts...) })
}
