package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"runtime"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"weir/cmd/weir/internal/demo"
	"weir/datapath/tun"
	"weir/policy/config"
)

// tunClients is the clients' side of `weir demo --tun`: a network namespace
// of its own holding weir's TUN, whose kernel TCP stack is the clients.
type tunClients struct {
	ns, orig netns.NsHandle
	dev      *tun.Device
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
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		return nil, fmt.Errorf("current network namespace: %w", err)
	}
	ns, err := netns.New() // creates the namespace and moves this thread into it
	if err != nil {
		orig.Close()
		return nil, fmt.Errorf("new network namespace: %w", err)
	}
	c := &tunClients{ns: ns, orig: orig}
	err = func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		if err := netlink.LinkSetUp(lo); err != nil {
			return err
		}
		devs, err := tun.Open(tun.Options{Name: "weir-demo", Addrs: []netip.Prefix{clientAddr}, Routes: tun.VIPRoutes(cfg)})
		if err != nil {
			return err
		}
		c.dev = devs[0]
		return nil
	}()
	if serr := netns.Set(orig); serr != nil {
		// This thread is stuck in the demo namespace: keep it locked so
		// that it exits with this goroutine instead of serving others.
		runtime.LockOSThread()
		err = errors.Join(err, serr)
	}
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("weir demo --tun: %w", err)
	}
	return c, nil
}

// Dial connects from inside the namespace: the socket is created on a
// thread in it and stays there.
func (c *tunClients) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	runtime.LockOSThread()
	if err := netns.Set(c.ns); err != nil {
		runtime.UnlockOSThread()
		return nil, err
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, network, addr)
	if serr := netns.Set(c.orig); serr != nil {
		return nil, errors.Join(err, serr) // the thread stays locked and dies with this goroutine
	}
	runtime.UnlockOSThread()
	return conn, err
}

// Close removes the TUN and lets the namespace go.
func (c *tunClients) Close() error {
	if c.dev != nil {
		c.dev.Close()
	}
	c.ns.Close()
	return c.orig.Close()
}
