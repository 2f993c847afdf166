// Package netns makes network namespaces of their own, for `weir demo --tun`
// and for the tests that need one (TUN devices, veth pairs, `weir run`
// under test): one way to make them, whoever needs them.
//
// A namespace here is unnamed: it lives while its file descriptor (held by
// the NS), a socket made in it or a process started in it lives, so a
// crashed test or demo leaves nothing behind in /var/run/netns. Code runs
// inside it on an OS thread of its own (Do), so that the rest of the
// process never finds itself in the wrong namespace.
package netns

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"sync"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// NS is a network namespace with its loopback up. The zero value is not
// usable; call New. Its methods are safe for concurrent use.
type NS struct {
	fd        int // /proc/thread-self/ns/net of the thread that made it
	closeOnce sync.Once
}

// New creates a network namespace and brings its loopback up. It needs
// CAP_SYS_ADMIN (root).
func New() (*NS, error) {
	type result struct {
		fd  int
		err error
	}
	c := make(chan result, 1)
	go func() {
		// Never unlocked: once unshared, this thread's namespace is not
		// the process's, so the runtime must discard the thread when the
		// goroutine ends rather than reuse it.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			c <- result{err: fmt.Errorf("new network namespace: %w", err)}
			return
		}
		fd, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			c <- result{err: fmt.Errorf("new network namespace: %w", err)}
			return
		}
		// A fresh namespace's loopback is down; IPv6 will not even
		// deliver to a local address without it.
		if err := loUp(); err != nil {
			unix.Close(fd)
			c <- result{err: err}
			return
		}
		c <- result{fd: fd}
	}()
	r := <-c
	if r.err != nil {
		return nil, r.err
	}
	return &NS{fd: r.fd}, nil
}

func loUp() error {
	lo, err := netlink.LinkByName("lo")
	if err == nil {
		err = netlink.LinkSetUp(lo)
	}
	if err != nil {
		return fmt.Errorf("loopback up: %w", err)
	}
	return nil
}

// FD is the namespace's file descriptor, for moving a link into it
// (netlink.LinkSetNsFd). It is valid until Close.
func (n *NS) FD() int { return n.fd }

// Do runs f on a new OS thread inside the namespace and returns its error.
// Sockets, TUN devices and processes f creates belong to the namespace
// wherever they are used later. The thread ends with f (it is never handed
// back to other goroutines): a process f starts with
// SysProcAttr.Pdeathsig is signalled when f returns, so f waits for it.
func (n *NS) Do(f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: see above
		if err := unix.Setns(n.fd, unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("enter network namespace: %w", err)
			return
		}
		errc <- f()
	}()
	return <-errc
}

// Dial connects from inside the namespace (a bench.DialFunc).
func (n *NS) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := n.Do(func() (err error) {
		var d net.Dialer
		c, err = d.DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// Listen listens inside the namespace.
func (n *NS) Listen(network, addr string) (net.Listener, error) {
	var ln net.Listener
	err := n.Do(func() (err error) {
		ln, err = net.Listen(network, addr)
		return err
	})
	return ln, err
}

// Enter moves the calling goroutine, locked to its OS thread, into the
// namespace until leave is called, for code that cannot run inside Do (a
// test that creates and uses TUN devices throughout). If leave fails to
// move the thread back, the thread stays locked and dies with the
// goroutine rather than serve others inside the namespace.
func (n *NS) Enter() (leave func() error, err error) {
	runtime.LockOSThread()
	orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		runtime.UnlockOSThread()
		return nil, fmt.Errorf("current network namespace: %w", err)
	}
	if err := unix.Setns(n.fd, unix.CLONE_NEWNET); err != nil {
		unix.Close(orig)
		runtime.UnlockOSThread()
		return nil, fmt.Errorf("enter network namespace: %w", err)
	}
	return func() error {
		defer unix.Close(orig)
		if err := unix.Setns(orig, unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("leave network namespace: %w", err)
		}
		runtime.UnlockOSThread()
		return nil
	}, nil
}

// Close lets the namespace go: it disappears once the sockets, devices and
// processes made in it are gone too.
func (n *NS) Close() error {
	err := errors.New("network namespace already closed")
	n.closeOnce.Do(func() { err = unix.Close(n.fd) })
	return err
}
