package udp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"syscall"
)

// HostDialer dials targets with kernel UDP sockets, one connected socket
// per session (so the target's replies come back to that session alone).
// The zero value works.
type HostDialer struct {
	// Dialer is the net.Dialer used; its zero value works.
	Dialer net.Dialer
}

// DialUDP implements Dialer.
func (d *HostDialer) DialUDP(ctx context.Context, addr netip.AddrPort) (Target, error) {
	c, err := d.Dialer.DialContext(ctx, "udp", addr.String())
	if err != nil {
		return nil, err
	}
	uc, ok := c.(*net.UDPConn)
	if !ok {
		c.Close()
		return nil, fmt.Errorf("udp: dial %v: not a UDP socket (%T)", addr, c)
	}
	rc, err := uc.SyscallConn()
	if err != nil {
		uc.Close()
		return nil, err
	}
	return &hostTarget{UDPConn: uc, rc: rc}, nil
}

// hostTarget is a connected kernel UDP socket whose reader waits for a
// datagram holding no buffer (the poller's readiness, then one read).
type hostTarget struct {
	*net.UDPConn
	rc syscall.RawConn
}

// ReadDatagram implements Target.
func (t *hostTarget) ReadDatagram(pool *sync.Pool) (*[]byte, int, error) {
	var (
		bp   *[]byte
		n    int
		rerr error
	)
	err := t.rc.Read(func(fd uintptr) bool {
		bp = pool.Get().(*[]byte)
		var e error
		n, _, e = syscall.Recvfrom(int(fd), *bp, syscall.MSG_DONTWAIT)
		if errors.Is(e, syscall.EAGAIN) || errors.Is(e, syscall.EINTR) {
			pool.Put(bp)
			bp = nil
			return false // not ready: wait for the poller, no buffer held
		}
		rerr = e
		return true
	})
	if err == nil {
		err = rerr
	}
	if err != nil {
		if bp != nil {
			pool.Put(bp)
		}
		return nil, 0, err
	}
	return bp, n, nil
}
