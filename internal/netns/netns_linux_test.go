package netns_test

import (
	"context"
	"net"
	"os"
	"testing"
	"time"

	"weir/internal/netns"
	"weir/internal/testutil"
)

func TestMain(m *testing.M) { testutil.VerifyNoLeaks(m) }

// TestNamespaceIsItsOwn: a listener made in the namespace is reachable from
// inside it (Dial, Enter) and not from the test's own namespace, and the
// loopback is up (an IPv6 listener on ::1 works).
func TestNamespaceIsItsOwn(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("skipping: needs root to create a network namespace")
	}
	ns, err := netns.New()
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	ln, err := ns.Listen("tcp", "[::1]:0")
	if err != nil {
		t.Fatalf("listen on ::1 inside (is lo up?): %v", err)
	}
	defer ln.Close()
	addr := ln.Addr().String()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := ns.Dial(ctx, "tcp", addr)
	if err != nil {
		t.Fatalf("dial from inside: %v", err)
	}
	c.Close()
	if c, err := (&net.Dialer{Timeout: time.Second}).Dial("tcp", addr); err == nil {
		c.Close()
		t.Fatalf("%s inside the namespace is reachable from outside it", addr)
	}

	leave, err := ns.Enter()
	if err != nil {
		t.Fatal(err)
	}
	c, err = net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		leave()
		t.Fatalf("dial after Enter: %v", err)
	}
	c.Close()
	if err := leave(); err != nil {
		t.Fatal(err)
	}
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		c.Close()
		t.Fatal("still inside the namespace after leave")
	}
	if err := ns.Close(); err != nil {
		t.Fatal(err)
	}
	if err := ns.Close(); err == nil {
		t.Error("a second Close reported no error")
	}
}
