package netstack

import (
	"errors"
	"fmt"
	"math"
	"net/netip"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/waiter"

	"weir/policy"
)

// listener is one listening endpoint for a VIP and port (see the connection
// flow in forwarder.go). Its accept loop owns ep: only the loop closes it.
type listener struct {
	vip     netip.AddrPort
	ep      tcpip.Endpoint
	wq      waiter.Queue
	backlog int
	// handshake is the service's timeouts.handshake: sweepHalfOpen aborts
	// the listener's half-open handshakes older than that. Protected by lmu.
	handshake time.Duration
	stats     *tcp.Stats    // ep's own counters (listenDrops)
	done      chan struct{} // closed to stop the accept loop
}

// ListenDrops count the segments VIP listeners dropped past the SYN, the
// path of a connection a SYN cookie (or the backlog) let in; the client
// sends such a segment again only after its retransmission timeout.
type ListenDrops struct {
	// SegmentQueue: segments the listener's queue refused (its receive
	// memory over the limit: see liftListenerQueueLimit).
	SegmentQueue uint64
	// AcceptQueue: handshake-completing ACKs, with any data they carried,
	// dropped because the accept queue was full.
	AcceptQueue uint64
	// Failed: SYNs and cookie ACKs whose connection the listener could not
	// make (no route, the 4-tuple's port reservation or registration).
	Failed uint64
}

func (d *ListenDrops) add(o ListenDrops) {
	d.SegmentQueue += o.SegmentQueue
	d.AcceptQueue += o.AcceptQueue
	d.Failed += o.Failed
}

// drops reads the listener's counters; safe after its endpoint closed.
func (l *listener) drops() ListenDrops {
	return ListenDrops{
		SegmentQueue: l.stats.ReceiveErrors.SegmentQueueDropped.Value(),
		AcceptQueue:  l.stats.ReceiveErrors.ListenOverflowAckDrop.Value(),
		Failed:       l.stats.FailedConnectionAttempts.Value(),
	}
}

// listenDrops sums the counters of the listeners open, closing and gone.
func (f *Forwarder) listenDrops() ListenDrops {
	f.lmu.Lock()
	defer f.lmu.Unlock()
	d := f.listenGone
	for _, l := range f.listeners {
		d.add(l.drops())
	}
	for l := range f.listenClosing {
		d.add(l.drops())
	}
	return d
}

// retire moves a listener out of the map and stops its accept loop; its
// counters keep counting in listenDrops. Call with lmu held.
func (f *Forwarder) retire(vip netip.AddrPort, l *listener) {
	close(l.done)
	delete(f.listeners, vip)
	if f.listenClosing == nil {
		f.listenClosing = map[*listener]struct{}{}
	}
	f.listenClosing[l] = struct{}{}
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
	hs := map[netip.AddrPort]time.Duration{}
	for _, vs := range services {
		if vs == nil || vs.Ports.Lo == 0 || vs.Ports.Hi < vs.Ports.Lo || int(vs.Ports.Hi-vs.Ports.Lo) >= MaxListenPorts {
			continue
		}
		backlog := vs.Timeouts.InFlightPerVIP
		for _, a := range vs.VIPs {
			for p := int(vs.Ports.Lo); p <= int(vs.Ports.Hi); p++ {
				want[netip.AddrPortFrom(a.Unmap(), uint16(p))] = backlog
				hs[netip.AddrPortFrom(a.Unmap(), uint16(p))] = vs.Timeouts.Handshake
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
			f.retire(vip, l)
		}
	}
	var errs []error
	for vip, backlog := range want {
		if l := f.listeners[vip]; l != nil {
			l.handshake = hs[vip]
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
		l.handshake = hs[vip]
		f.listeners[vip] = l
		f.lwg.Add(1)
		go f.acceptLoop(l)
	}
	switch {
	case len(f.listeners) > 0 && f.sweepStop == nil:
		f.sweepStop = make(chan struct{})
		f.lwg.Add(1)
		go f.sweepHalfOpen(f.sweepStop)
	case len(f.listeners) == 0 && f.sweepStop != nil:
		close(f.sweepStop)
		f.sweepStop = nil
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
	liftListenerQueueLimit(ep)
	l.ep = ep
	l.stats = ep.Stats().(*tcp.Stats)
	return l, nil
}

// liftListenerQueueLimit takes the receive-buffer limit off a listening
// endpoint's segment queue; call it after Listen, which sized the SYN
// cookies' receive window from the buffer (the window stays as it was).
//
// gVisor charges every segment queued to the listener to the listener's
// receive memory (segment.setOwner) and, when the listener hands a segment
// on to the connection a SYN cookie just made (a cookie ACK carrying data,
// or the client's request queued behind that ACK: accept.go
// handleListenSegment), re-charges it to the new endpoint without ever
// giving the listener its share back. The listener's count grows by about
// 650 bytes per such segment and never falls, so once about 400 connections
// had completed through cookies (256 KiB, the default buffer) the listener
// refused every data segment that reached it (segmentQueue.enqueue admits
// only empty segments past the limit): the client's first data segment was
// dropped and came again after the client's RTO, 200 ms on Linux, for every
// later cookie connection. With the limit at MaxInt32 the int32 count can
// never exceed it. A listener's queue holds segments only until its
// processor handles them (a SYN answered, a cookie checked), which does
// not wait on any peer, so nothing else bounds it less than before.
func liftListenerQueueLimit(ep tcpip.Endpoint) {
	ep.SocketOptions().SetReceiveBufferSize(math.MaxInt32, false)
}

// acceptLoop runs in its own goroutine, one per listener: it hands each
// established connection to handOver in a goroutine of its own, until the
// listener is stopped, and then closes the endpoint.
func (f *Forwarder) acceptLoop(l *listener) {
	defer f.lwg.Done()
	defer func() {
		l.ep.Close()
		f.lmu.Lock()
		if _, ok := f.listenClosing[l]; ok { // else still in listeners, read there
			delete(f.listenClosing, l)
			f.listenGone.add(l.drops())
		}
		f.lmu.Unlock()
	}()
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
		c := newConn(wq, ep.(*tcp.Endpoint))
		if !f.remember(c) {
			continue
		}
		f.s.setKeepalive(ep)
		f.accepted1(c, l.vip)
	}
}

// remember records a connection a listener accepted in the recent
// 4-tuples until recentFor after it ends, or, if its 4-tuple is still
// remembered from an earlier connection with no SYN since, aborts it as a
// cookie replay (see Cookie replays in timewait.go), counts it and
// returns false.
func (f *Forwarder) remember(c *Conn) bool {
	r := &f.tw.recent
	k := keyOf(c.ep.Info().(*stack.TransportEndpointInfo).ID)
	gen, replay := r.accept(k)
	if replay {
		r.replays.Add(1)
		c.Reset()
		return false
	}
	ended := func() bool {
		switch c.state() {
		case tcp.StateClose, tcp.StateError:
			r.ended(k, gen)
			return true
		}
		return false
	}
	// The stack notifies EventHUp when the connection closes (and when it
	// enters TIME_WAIT). The callback runs in the notifier's context and
	// must not touch the waiter queue.
	entry := waiter.NewFunctionEntry(waiter.EventHUp, func(waiter.EventMask) { ended() })
	c.wq.EventRegister(&entry)
	ended() // it may have closed before the entry was registered
	return true
}

// accepted1 starts serving one connection a listener accepted.
func (f *Forwarder) accepted1(client *Conn, vip netip.AddrPort) {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		f.refusedClosed.Add(1)
		client.Reset()
		return
	}
	f.wg.Add(1)
	f.mu.Unlock()
	f.workers.Go(func() {
		defer f.wg.Done()
		defer f.recoverConn(client.Reset)
		f.handOver(client, vip)
	})
}

// closeListeners stops every listener and waits for the accept loops.
func (f *Forwarder) closeListeners() {
	f.lmu.Lock()
	for vip, l := range f.listeners {
		f.retire(vip, l)
	}
	if f.sweepStop != nil {
		close(f.sweepStop)
		f.sweepStop = nil
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
	f.opts.Handler.Drain()
}

// sweepHalfOpen aborts the half-open handshakes of listeners that are older
// than their service's timeouts.handshake, until stop is closed. gVisor
// keeps a listener's half-open handshake through its fixed SYN-ACK
// schedule (1 s doubling to 64 s, 127 s in all; TCPSynRetriesOption does
// not shorten it), so the spoofed SYNs of a flood held the backlog, and
// the VIP in SYN-cookie mode, for two minutes after the flood stopped.
// Every tick (a quarter of the shortest handshake timeout) it lists the
// stack's endpoints and finds those in SYN-RCVD on a listener's address; an
// endpoint first seen at a sweep was made after the sweep before, so its
// age is at most the time since then, and it is aborted at the last sweep
// before that bound passes the timeout. Each abort counts in
// HandshakeTimedOut. The scan costs one pass over the stack's endpoints
// per tick.
func (f *Forwarder) sweepHalfOpen(stop <-chan struct{}) {
	defer f.lwg.Done()
	seen := map[*tcp.Endpoint]time.Time{} // half-open endpoint -> a time before it was made
	prev := time.Now()
	for {
		tick, limits := f.halfOpenLimits()
		t := time.NewTimer(tick)
		select {
		case <-stop:
			t.Stop()
			return
		case <-t.C:
		}
		now := time.Now()
		next := make(map[*tcp.Endpoint]time.Time, len(seen))
		for _, e := range f.s.s.RegisteredEndpoints() {
			ep, ok := e.(*tcp.Endpoint)
			if !ok || ep.EndpointState() != tcp.StateSynRecv {
				continue
			}
			id := ep.Info().(*stack.TransportEndpointInfo).ID
			limit, ok := limits[netip.AddrPortFrom(netipAddr(id.LocalAddress), id.LocalPort)]
			if !ok {
				continue // a tcp.Forwarder handshake: it has its own timer
			}
			born, ok := seen[ep]
			if !ok {
				born = prev
			}
			// The next sweep comes a tick from now: abort now if the
			// handshake could be past its limit by then.
			if now.Add(tick).Sub(born) >= limit {
				ep.Abort()
				f.hsTimedOut.Add(1)
				continue
			}
			next[ep] = born
		}
		seen, prev = next, now
	}
}

// halfOpenLimits returns the sweep interval and each listener's handshake
// timeout.
func (f *Forwarder) halfOpenLimits() (time.Duration, map[netip.AddrPort]time.Duration) {
	f.lmu.Lock()
	defer f.lmu.Unlock()
	limits := make(map[netip.AddrPort]time.Duration, len(f.listeners))
	least := policy.DefaultHandshakeTimeout
	for vip, l := range f.listeners {
		hs := l.handshake
		if hs <= 0 {
			hs = policy.DefaultHandshakeTimeout
		}
		limits[vip] = hs
		least = min(least, hs)
	}
	return max(least/4, 10*time.Millisecond), limits
}
