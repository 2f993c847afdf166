package netstack

import (
	"context"
	"errors"
	"net/netip"
	"sync"
	"testing"
	"time"

	udprelay "weir/netstack/proxy/udp"
)

// TestUDPConnPortUnreachable: a back-arm UDP socket whose datagram meets
// ICMP port unreachable (no socket at weir's VIP port) returns
// ErrConnectionRefused from a read that was already waiting: the relay
// counts it as the target failing, the udp health check as refused.
func TestUDPConnPortUnreachable(t *testing.T) {
	r := newRig(t, rigOptions{})
	d := &StackDialer{Stack: r.client, NIC: r.clientNIC}
	tg, err := d.DialUDP(context.Background(), netip.AddrPortFrom(vipV4, 9))
	if err != nil {
		t.Fatal(err)
	}
	defer tg.Close()
	pool := sync.Pool{New: func() any { b := make([]byte, udprelay.MaxDatagram); return &b }}
	got := make(chan error, 1)
	go func() {
		_, _, err := tg.ReadDatagram(&pool)
		got <- err
	}()
	if _, err := tg.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if !errors.Is(err, ErrConnectionRefused) {
			t.Errorf("read: %v, want ErrConnectionRefused", err)
		}
	case <-time.After(10 * time.Second):
		tg.Close()
		t.Fatalf("the read did not end on ICMP port unreachable (%v after close)", <-got)
	}
}
