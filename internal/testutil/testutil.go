// Package testutil holds the helpers weir's tests share: waiting for a
// condition without a fixed sleep (Eventually, Within), a goroutine-safe
// output buffer, whether the race detector is on, goroutine leak checks,
// and network namespaces of the test's own (NetNS, EnterNetNS, over
// weir/internal/netns). Its subpackage weirproc starts the weir binary. It
// is imported only by _test files (deps_test.go checks).
package testutil

import (
	"bytes"
	"fmt"
	"sync"
	"testing"
	"time"
)

// Poll is how often Eventually checks its condition.
const Poll = 5 * time.Millisecond

// Eventually calls cond every Poll until it returns true, and fails the test
// with the message (fmt.Sprintf(format, args...)) if it has not within
// timeout. It returns at once when cond is already true.
func Eventually(t testing.TB, timeout time.Duration, cond func() bool, format string, args ...any) {
	t.Helper()
	if !Within(timeout, cond) {
		t.Fatalf("not within %v: %s", timeout, fmt.Sprintf(format, args...))
	}
}

// Within reports whether cond became true within timeout, checking every
// Poll. Use it where a test branches on the answer; Eventually where it
// fails.
func Within(timeout time.Duration, cond func() bool) bool {
	return WithinEvery(timeout, Poll, cond)
}

// WithinEvery is Within checking every period: for a condition that costs
// something to check (an HTTP request, a log file to parse), so that the
// test does not load the machine it measures.
func WithinEvery(timeout, period time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(period)
	}
	return true
}

// SyncBuffer is an io.Writer safe for concurrent use that keeps the first
// Limit bytes written (1 MiB when Limit is zero) and drops the rest, so a
// chatty process cannot exhaust a test's memory. The zero value is ready.
type SyncBuffer struct {
	Limit int

	mu  sync.Mutex
	buf bytes.Buffer
}

// Write keeps as much of p as fits under the limit and always reports
// len(p) written.
func (b *SyncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	limit := b.Limit
	if limit == 0 {
		limit = 1 << 20
	}
	if room := limit - b.buf.Len(); room > 0 {
		b.buf.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

// String returns everything kept so far.
func (b *SyncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Tail returns the last n bytes kept.
func (b *SyncBuffer) Tail(n int) string {
	s := b.String()
	return s[max(0, len(s)-n):]
}
