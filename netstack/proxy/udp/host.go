package udp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"syscall"

	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
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
	t := &hostTarget{UDPConn: uc, rc: rc}
	if addr.Addr().Unmap().Is4() {
		t.bc = ipv4.NewPacketConn(uc)
	} else {
		t.bc = ipv6.NewPacketConn(uc)
	}
	return t, nil
}

// batchConn is x/net's ipv4 or ipv6 PacketConn: sendmmsg.
type batchConn interface {
	WriteBatch(ms []ipv4.Message, flags int) (int, error)
}

// hostTarget is a connected kernel UDP socket whose reader waits for a
// datagram holding no buffer (the poller's readiness, then one read).
type hostTarget struct {
	*net.UDPConn
	rc   syscall.RawConn
	bc   batchConn
	msgs []ipv4.Message // WriteBatch's, reused: one writer (the VIP reader)
}

// WriteBatch implements BatchWriter: the datagrams in as few sendmmsg
// calls as the socket takes them.
func (t *hostTarget) WriteBatch(bs [][]byte) (int, error) {
	if cap(t.msgs) < len(bs) {
		t.msgs = make([]ipv4.Message, len(bs))
		for i := range t.msgs {
			t.msgs[i].Buffers = make([][]byte, 1)
		}
	}
	ms := t.msgs[:len(bs)]
	for i, b := range bs {
		ms[i].Buffers[0] = b
	}
	// The poller waits while the socket's buffer is full; a short count
	// is a datagram the kernel refused (the next call reports why).
	done := 0
	var err error
	for done < len(ms) && err == nil {
		var n int
		n, err = t.bc.WriteBatch(ms[done:], 0)
		if n == 0 && err == nil {
			err = io.ErrShortWrite
		}
		done += n
	}
	for i := range ms {
		ms[i].Buffers[0] = nil
	}
	return done, err
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
