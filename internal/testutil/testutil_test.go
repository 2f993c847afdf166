package testutil

import (
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestWithin(t *testing.T) {
	var n atomic.Int32
	if !Within(time.Second, func() bool { return n.Add(1) >= 3 }) {
		t.Fatal("condition true on the third call not seen")
	}
	if Within(20*time.Millisecond, func() bool { return false }) {
		t.Fatal("a condition never true was reported met")
	}
	n.Store(0)
	start := time.Now()
	if !WithinEvery(time.Second, 30*time.Millisecond, func() bool { return n.Add(1) >= 3 }) {
		t.Fatal("WithinEvery: condition true on the third call not seen")
	}
	if el := time.Since(start); el < 60*time.Millisecond {
		t.Errorf("WithinEvery checked three times in %v, want two 30 ms periods between them", el)
	}
}

func TestSyncBufferKeepsTheLimit(t *testing.T) {
	b := SyncBuffer{Limit: 10}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			if n, err := b.Write([]byte("abcdef")); n != 6 || err != nil {
				t.Errorf("Write = %d, %v", n, err)
			}
		})
	}
	wg.Wait()
	if got := b.String(); len(got) != 10 {
		t.Fatalf("kept %q (%d bytes), want 10", got, len(got))
	}
	if got := b.Tail(3); len(got) != 3 || !strings.HasSuffix(b.String(), got) {
		t.Fatalf("Tail(3) = %q", got)
	}
}

func TestCheckNoLeaksSeesNothingOfOthers(t *testing.T) {
	stop := make(chan struct{})
	go func() { <-stop }() // started before the snapshot: not this test's
	defer close(stop)
	t.Run("clean", func(t *testing.T) {
		CheckNoLeaks(t)
		done := make(chan struct{})
		go func() { close(done) }()
		<-done
	})
}
