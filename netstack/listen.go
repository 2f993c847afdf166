package netstack

import (
	"errors"
	"fmt"
	"net/netip"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/waiter"

	"weir/netstack/proxy"
	"weir/policy"
)

// listener is one listening endpoint for a VIP and port (see the connection
// flow in forwarder.go). Its accept loop owns ep: only the loop closes it.
type listener struct {
	vip     netip.AddrPort
	ep      tcpip.Endpoint
	wq      waiter.Queue
	backlog int
	done    chan struct{} // closed to stop the accept loop
}

// Listen makes the forwarder listen on every VIP and port of services (each
// port of a service whose range has at most MaxListenPorts ports), with a
// SYN backlog of the service's InFlightPerVIP, and stops listening where no
// service is left. Call it with the services of every config the Services
// func answers from, after each swap; SYNs to a VIP and port without a
// listener take the tcp.Forwarder path. Connections already accepted are
// not touched; a removed listener's half-open handshakes are reset.
// The error names the listeners that could not be opened (their SYNs take
// the tcp.Forwarder path).
func (f *Forwarder) Listen(services []*policy.VirtualServer) error {
	want := map[netip.AddrPort]int{}
	for _, vs := range services {
		if vs == nil || vs.Ports.Lo == 0 || vs.Ports.Hi < vs.Ports.Lo || int(vs.Ports.Hi-vs.Ports.Lo) >= MaxListenPorts {
			continue
		}
		backlog := vs.Timeouts.InFlightPerVIP
		for _, a := range vs.VIPs {
			for p := int(vs.Ports.Lo); p <= int(vs.Ports.Hi); p++ {
				want[netip.AddrPortFrom(a.Unmap(), uint16(p))] = backlog
			}
		}
	}
	f.lmu.Lock()
	defer f.lmu.Unlock()
	f.mu.Lock()
	closed := f.closed
	f.mu.Unlock()
	if closed || f.draining.Load() { // checked under lmu: Drain's closeListeners waits for it
		return nil
	}
	for vip, l := range f.listeners {
		if _, ok := want[vip]; !ok {
			close(l.done)
			delete(f.listeners, vip)
		}
	}
	var errs []error
	for vip, backlog := range want {
		if l := f.listeners[vip]; l != nil {
			if l.backlog != backlog {
				// gVisor adjusts a listening endpoint's backlog in place.
				if terr := l.ep.Listen(backlog); terr == nil {
					l.backlog = backlog
				}
			}
			continue
		}
		l, err := f.openListener(vip, backlog)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		f.listeners[vip] = l
		f.lwg.Add(1)
		go f.acceptLoop(l)
	}
	return errors.Join(errs...)
}

// openListener binds a listening endpoint to vip. The front NICs spoof, so
// gVisor lets it bind an address no NIC holds.
func (f *Forwarder) openListener(vip netip.AddrPort, backlog int) (*listener, error) {
	l := &listener{vip: vip, backlog: backlog, done: make(chan struct{})}
	ep, terr := f.s.s.NewEndpoint(tcp.ProtocolNumber, protoOf(vip.Addr()), &l.wq)
	if terr != nil {
		return nil, fmt.Errorf("netstack: listen %v: %w", vip, asError(terr))
	}
	ep.SocketOptions().SetReuseAddress(true)
	if terr := ep.Bind(fullAddr(vip)); terr != nil {
		ep.Close()
		return nil, fmt.Errorf("netstack: listen %v: bind: %w", vip, asError(terr))
	}
	if terr := ep.Listen(backlog); terr != nil {
		ep.Close()
		return nil, fmt.Errorf("netstack: listen %v: %w", vip, asError(terr))
	}
	l.ep = ep
	return l, nil
}

// acceptLoop runs in its own goroutine, one per listener: it hands each
// established connection to serve in a goroutine of its own, until the
// listener is stopped, and then closes the endpoint.
func (f *Forwarder) acceptLoop(l *listener) {
	defer f.lwg.Done()
	defer l.ep.Close()
	entry, ready := waiter.NewChannelEntry(waiter.ReadableEvents)
	l.wq.EventRegister(&entry)
	defer l.wq.EventUnregister(&entry)
	for {
		ep, wq, terr := l.ep.Accept(nil)
		if terr != nil {
			if _, ok := terr.(*tcpip.ErrWouldBlock); !ok {
				return
			}
			select {
			case <-ready:
				continue
			case <-l.done:
				return
			}
		}
		select {
		case <-l.done:
			ep.Abort()
			ep.Close()
			return
		default:
		}
		f.s.setKeepalive(ep)
		f.accepted1(newConn(wq, ep.(*tcp.Endpoint)), l.vip)
	}
}

// accepted1 starts serving one connection a listener accepted.
func (f *Forwarder) accepted1(client *Conn, vip netip.AddrPort) {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		f.refusedClosed.Add(1)
		client.reset()
		return
	}
	f.wg.Add(1)
	f.mu.Unlock()
	f.pendingN.Add(1)
	f.workers.Go(func() {
		defer f.wg.Done()
		var req *proxy.ConnRequest
		defer f.recoverConn(&req, client.reset)
		f.serve(&req, client, vip)
	})
}

// closeListeners stops every listener and waits for the accept loops.
func (f *Forwarder) closeListeners() {
	f.lmu.Lock()
	for vip, l := range f.listeners {
		close(l.done)
		delete(f.listeners, vip)
	}
	f.lmu.Unlock()
	f.lwg.Wait()
}

func (f *Forwarder) listenerCount() int {
	f.lmu.Lock()
	defer f.lmu.Unlock()
	return len(f.listeners)
}

// Drain stops taking new connections, as a server closes its listening
// socket: every listener closes (its half-open handshakes are reset) and
// from now on every SYN gets RST before any SYN-ACK (RefusedClosed), so a
// client sees "connection refused" and tries another instance. Connections
// already accepted go on; Listen does nothing any more.
func (f *Forwarder) Drain() {
	f.draining.Store(true)
	f.closeListeners()
}
