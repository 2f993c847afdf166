package main

// The kernel-socket proxy: a yardstick, not an appliance. It terminates
// each client connection with a kernel socket and opens another to the
// server, then copies both ways (Go's io.Copy between two TCP sockets is
// splice(2): no copy through user space). It does what weir does to a
// connection with no TUN, no userspace TCP and no policy, so its figures
// bound what any TCP-terminating proxy reaches on the machine: two TCP
// endpoints more per connection than the kernel's forwarding.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"time"
)

// kproxyMain is `weirbench kproxy`: listen on each of -ports at -listen
// and proxy to the same port at -to, until killed.
func kproxyMain(args []string) error {
	fs := newFlagSet("kproxy")
	listen := fs.String("listen", "", "address to listen on")
	to := fs.String("to", "", "address to connect to")
	ports := fs.String("ports", "", "comma-separated ports")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *listen == "" || *to == "" || *ports == "" {
		return errors.New("kproxy: need -listen, -to and -ports")
	}
	ctx, stop := signalContext()
	defer stop()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for _, p := range strings.Split(*ports, ",") {
		ln, err := net.Listen("tcp", net.JoinHostPort(*listen, p))
		if err != nil {
			return err
		}
		go func() { <-ctx.Done(); ln.Close() }()
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := kproxyServe(ln, net.JoinHostPort(*to, p)); ctx.Err() == nil {
				errs <- err
			}
		}()
	}
	fmt.Println("proxying", *ports, "to", *to)
	select {
	case <-ctx.Done():
	case err := <-errs:
		stop()
		wg.Wait()
		return err
	}
	wg.Wait()
	return nil
}

// kproxyServe accepts on ln until it is closed, each connection proxied
// to addr on a goroutine of its own.
func kproxyServe(ln net.Listener, addr string) error {
	d := net.Dialer{Timeout: 3 * time.Second}
	for {
		c, err := ln.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return err
		}
		go func() {
			defer c.Close()
			t, err := d.DialContext(context.Background(), "tcp", addr)
			if err != nil {
				return
			}
			defer t.Close()
			done := make(chan struct{})
			go func() { kproxyCopy(t, c); close(done) }()
			kproxyCopy(c, t)
			<-done
		}()
	}
}

// kproxyCopy copies src to dst and passes src's FIN on.
func kproxyCopy(dst, src net.Conn) {
	if _, err := io.Copy(dst, src); err != nil {
		dst.(*net.TCPConn).SetLinger(0)
		dst.Close()
		return
	}
	dst.(*net.TCPConn).CloseWrite()
}
