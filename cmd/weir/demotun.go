package main

import (
	"context"
	"fmt"
	"net"
	"net/netip"

	"weir/cmd/weir/internal/demo"
	"weir/datapath/tun"
	"weir/internal/netns"
	"weir/policy/config"
)

// tunClients is the clients' side of `weir demo --tun`: a network namespace
// of its own holding weir's TUN, whose kernel TCP stack is the clients.
type tunClients struct {
	ns  *netns.NS
	dev *tun.Device
}

// clientAddr is the clients' address in the demo namespace.
var clientAddr = netip.MustParsePrefix("198.18.0.2/32")

// newTUNClients creates an unnamed network namespace (it disappears with
// its last reference, so a crash leaves nothing behind), a TUN in it routing
// the demo's VIPs, and returns the TUN and a dialer whose sockets live in the
// namespace.
func newTUNClients() (*tunClients, error) {
	if err := preflight(); err != nil {
		return nil, fmt.Errorf("weir demo --tun: %w", err)
	}
	cfg, err := config.ParseYAML("demo.yaml", demo.Config)
	if err != nil {
		return nil, err
	}
	ns, err := netns.New()
	if err != nil {
		return nil, fmt.Errorf("weir demo --tun: %w", err)
	}
	c := &tunClients{ns: ns}
	if err := ns.Do(func() error {
		devs, err := tun.Open(tun.Options{Name: "weir-demo", Addrs: []netip.Prefix{clientAddr}, Routes: tun.VIPRoutes(cfg)})
		if err != nil {
			return err
		}
		c.dev = devs[0]
		return nil
	}); err != nil {
		c.Close()
		return nil, fmt.Errorf("weir demo --tun: %w", err)
	}
	return c, nil
}

// Dial connects from inside the namespace: the socket is created there and
// stays there.
func (c *tunClients) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	return c.ns.Dial(ctx, network, addr)
}

// Close removes the TUN and lets the namespace go.
func (c *tunClients) Close() error {
	if c.dev != nil {
		c.dev.Close()
	}
	return c.ns.Close()
}
