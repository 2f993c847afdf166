package netstack

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"

	"gvisor.dev/gvisor/pkg/tcpip"

	"weir/netstack/proxy"
)

// HostDialer dials targets with ordinary kernel sockets; their counters come
// from TCP_INFO. The zero value works.
type HostDialer struct {
	// Dialer is the net.Dialer used; its zero value works. Its Timeout
	// applies on top of the forwarder's DialTimeout.
	Dialer net.Dialer
}

// DialTarget implements Dialer.
func (d *HostDialer) DialTarget(ctx context.Context, addr netip.AddrPort) (proxy.Leg, error) {
	c, err := d.Dialer.DialContext(ctx, "tcp", addr.String())
	if err != nil {
		return nil, err
	}
	tc, ok := c.(*net.TCPConn)
	if !ok {
		c.Close()
		return nil, fmt.Errorf("netstack: dial %v: not a TCP connection (%T)", addr, c)
	}
	return &HostConn{TCPConn: tc}, nil
}

// StackDialer dials targets through a gVisor Stack: weir's back arm, a
// second NIC on any datapath.Device. Counters come from the gVisor endpoint.
type StackDialer struct {
	// Stack is the back arm; it needs a NIC with an address and a route to
	// the targets.
	Stack *Stack
	// NIC, when set, is the NIC every dial goes through (its routes must
	// cover the targets); nil means the stack's route table chooses.
	NIC *NIC
}

// ErrNoBackArm is returned when a target is to be dialed through the back
// arm but none was configured.
var ErrNoBackArm = errors.New("netstack: no back arm configured for a netstack target")

// DialTarget implements Dialer.
func (d *StackDialer) DialTarget(ctx context.Context, addr netip.AddrPort) (proxy.Leg, error) {
	if d == nil || d.Stack == nil {
		return nil, ErrNoBackArm
	}
	var nic tcpip.NICID
	if d.NIC != nil {
		nic = d.NIC.id
	}
	c, err := d.Stack.dialTCP(ctx, nic, netip.AddrPort{}, addr)
	if err != nil {
		return nil, err
	}
	return c, nil
}
