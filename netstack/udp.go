package netstack

// UDP services. Every VIP and port of a udp virtual server gets a UDP
// endpoint bound to it on the promiscuous (spoofing) front NIC, as the TCP
// listeners are: its datagrams reach that endpoint, whatever the source, and
// a reply written to it leaves from the VIP and port. One goroutine per
// endpoint reads its datagrams in order and hands each to a UDPHandler
// (weir/netstack/proxy/udp's Relay), which keeps the sessions. A datagram to
// a VIP and port with no endpoint still gets ICMP port unreachable (gVisor's
// rate limit bounds those); a udp service's own refusals send nothing.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"
	"gvisor.dev/gvisor/pkg/waiter"

	udprelay "weir/netstack/proxy/udp"
	"weir/policy"
)

// udpReceiveBuffer is a VIP endpoint's receive buffer: datagrams that
// arrive while its reader is busy wait there (beyond it gVisor drops and
// counts them: UDPFrontStats.ReceiveDropped).
const udpReceiveBuffer = 4 << 20

// UDPHandler takes the datagrams of udp services (weir/netstack/proxy/udp's
// Relay). Datagram is called by one goroutine per VIP and port; b is valid
// only during the call.
type UDPHandler interface {
	Datagram(out udprelay.Replier, client, vip netip.AddrPort, vs *policy.VirtualServer, b []byte)
}

// UDPBatchHandler is a UDPHandler that relays the datagrams a reader
// finds waiting together (udprelay.Relay): Queue as Datagram, and Flush
// before the reader waits for more, so that each session's datagrams go
// to its target in one call.
type UDPBatchHandler interface {
	UDPHandler
	Queue(bt *udprelay.Batch, out udprelay.Replier, client, vip netip.AddrPort, vs *policy.VirtualServer, b []byte)
	Flush(bt *udprelay.Batch)
}

// UDPFront owns the VIP endpoints of udp services on a Stack.
type UDPFront struct {
	s        *Stack
	h        UDPHandler
	services func(addr netip.Addr, port uint16) *policy.VirtualServer

	mu     sync.Mutex
	socks  map[netip.AddrPort]*udpSock // by mu
	closed bool                        // by mu
	gone   UDPFrontStats               // by mu: counters of closed endpoints
	wg     sync.WaitGroup
}

// UDPFrontStats are the VIP endpoints' counters.
type UDPFrontStats struct {
	Endpoints      int    // VIP and port endpoints open now
	Received       uint64 // datagrams read from them
	ReceiveDropped uint64 // datagrams dropped: an endpoint's receive buffer was full
	NoService      uint64 // datagrams whose service was reloaded away (dropped)
}

// udpSock is one VIP and port's endpoint with its reader.
type udpSock struct {
	vip       netip.AddrPort
	ep        tcpip.Endpoint
	wq        waiter.Queue
	received  atomic.Uint64
	noService atomic.Uint64
	done      chan struct{}
}

// NewUDPFront returns a front handing the datagrams of udp services to h;
// services finds each datagram's virtual server (after a reload, the new
// one). Listen opens the endpoints.
func NewUDPFront(s *Stack, h UDPHandler, services func(addr netip.Addr, port uint16) *policy.VirtualServer) *UDPFront {
	return &UDPFront{s: s, h: h, services: services, socks: map[netip.AddrPort]*udpSock{}}
}

// Listen opens an endpoint on every VIP and port of the udp services among
// services (a range of at most MaxListenPorts ports) and closes those of
// services gone. The error names the endpoints that could not be opened.
func (f *UDPFront) Listen(services []*policy.VirtualServer) error {
	want := map[netip.AddrPort]bool{}
	var errs []error
	for _, vs := range services {
		if vs == nil || vs.Proto != policy.ProtoUDP || vs.Ports.Lo == 0 || vs.Ports.Hi < vs.Ports.Lo {
			continue
		}
		if int(vs.Ports.Hi-vs.Ports.Lo) >= MaxListenPorts {
			errs = append(errs, fmt.Errorf("netstack: udp service %q: port range %v wider than %d ports", vs.Name, vs.Ports, MaxListenPorts))
			continue
		}
		for _, a := range vs.VIPs {
			for p := int(vs.Ports.Lo); p <= int(vs.Ports.Hi); p++ {
				want[netip.AddrPortFrom(a.Unmap(), uint16(p))] = true
			}
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return nil
	}
	for vip, s := range f.socks {
		if !want[vip] {
			f.retire(vip, s)
		}
	}
	for vip := range want {
		if f.socks[vip] != nil {
			continue
		}
		s, err := f.open(vip)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		f.socks[vip] = s
		f.wg.Add(1)
		go f.read(s)
	}
	return errors.Join(errs...)
}

// retire stops s's reader (which closes its endpoint). Call with mu held.
func (f *UDPFront) retire(vip netip.AddrPort, s *udpSock) {
	close(s.done) // the reader closes the endpoint
	delete(f.socks, vip)
	f.gone.add(s.stats())
}

func (f *UDPFront) open(vip netip.AddrPort) (*udpSock, error) {
	s := &udpSock{vip: vip, done: make(chan struct{})}
	ep, terr := f.s.s.NewEndpoint(udp.ProtocolNumber, protoOf(vip.Addr()), &s.wq)
	if terr != nil {
		return nil, fmt.Errorf("netstack: udp %v: %w", vip, asError(terr))
	}
	ep.SocketOptions().SetReuseAddress(true)
	ep.SocketOptions().SetReceiveBufferSize(udpReceiveBuffer, true)
	if terr := ep.Bind(fullAddr(vip)); terr != nil {
		ep.Close()
		return nil, fmt.Errorf("netstack: udp %v: bind: %w", vip, asError(terr))
	}
	s.ep = ep
	return s, nil
}

func (s *udpSock) stats() UDPFrontStats {
	st := UDPFrontStats{Received: s.received.Load(), NoService: s.noService.Load()}
	if es, ok := s.ep.Stats().(*tcpip.TransportEndpointStats); ok {
		st.ReceiveDropped = es.ReceiveErrors.ReceiveBufferOverflow.Value()
	}
	return st
}

func (st *UDPFrontStats) add(o UDPFrontStats) {
	st.Received += o.Received
	st.ReceiveDropped += o.ReceiveDropped
	st.NoService += o.NoService
}

// read hands s's datagrams to the handler, in order, until s is retired.
func (f *UDPFront) read(s *udpSock) {
	defer f.wg.Done()
	defer s.ep.Close()
	entry, ready := waiter.NewChannelEntry(waiter.ReadableEvents)
	s.wq.EventRegister(&entry)
	defer s.wq.EventUnregister(&entry)
	buf := make([]byte, udprelay.MaxDatagram)
	out := &vipReplier{s: s}
	// The datagrams read while more are waiting are queued and written
	// (each session's in one call) before the reader waits: no datagram
	// waits for one that has not arrived.
	bh, batched := f.h.(UDPBatchHandler)
	var bt udprelay.Batch
	defer func() {
		if batched {
			bh.Flush(&bt)
		}
	}()
	for {
		select {
		case <-s.done:
			return
		default:
		}
		w := tcpip.SliceWriter(buf)
		res, terr := s.ep.Read(&w, tcpip.ReadOptions{NeedRemoteAddr: true})
		if terr != nil {
			if _, ok := terr.(*tcpip.ErrWouldBlock); !ok {
				return
			}
			if batched {
				bh.Flush(&bt)
			}
			select {
			case <-ready:
				continue
			case <-s.done:
				return
			}
		}
		s.received.Add(1)
		vs := f.services(s.vip.Addr(), s.vip.Port())
		if vs == nil || vs.Proto != policy.ProtoUDP {
			s.noService.Add(1)
			continue
		}
		client := netip.AddrPortFrom(netipAddr(res.RemoteAddr.Addr), res.RemoteAddr.Port)
		if batched {
			bh.Queue(&bt, out, client, s.vip, vs, buf[:res.Count])
		} else {
			f.h.Datagram(out, client, s.vip, vs, buf[:res.Count])
		}
	}
}

// vipReplier writes replies from a VIP endpoint.
type vipReplier struct{ s *udpSock }

// WriteTo implements udprelay.Replier.
func (r *vipReplier) WriteTo(b []byte, client netip.AddrPort) error {
	to := fullAddr(netip.AddrPortFrom(client.Addr().Unmap(), client.Port()))
	_, terr := r.s.ep.Write(bytes.NewReader(b), tcpip.WriteOptions{To: &to})
	if terr != nil {
		return asError(terr)
	}
	return nil
}

// Stats returns the VIP endpoints' counters.
func (f *UDPFront) Stats() UDPFrontStats {
	f.mu.Lock()
	defer f.mu.Unlock()
	st := f.gone
	for _, s := range f.socks {
		st.add(s.stats())
	}
	st.Endpoints = len(f.socks)
	return st
}

// Close closes every VIP endpoint and waits for the readers.
func (f *UDPFront) Close() {
	f.mu.Lock()
	f.closed = true
	for vip, s := range f.socks {
		f.retire(vip, s)
	}
	f.mu.Unlock()
	f.wg.Wait()
}

// dialUDP opens a UDP socket through the stack connected to addr, through
// the NIC with ID nic (0: the route table's choice): a back-arm session's
// target socket.
func (s *Stack) dialUDP(nic tcpip.NICID, addr netip.AddrPort) (*UDPConn, error) {
	addr = netip.AddrPortFrom(addr.Addr().Unmap(), addr.Port())
	c := &UDPConn{}
	ep, terr := s.s.NewEndpoint(udp.ProtocolNumber, protoOf(addr.Addr()), &c.wq)
	if terr != nil {
		return nil, fmt.Errorf("netstack: udp dial %v: %w", addr, asError(terr))
	}
	remote := fullAddr(addr)
	remote.NIC = nic
	if terr := ep.Connect(remote); terr != nil {
		ep.Close()
		return nil, fmt.Errorf("netstack: udp dial %v: %w", addr, asError(terr))
	}
	c.ep = ep
	c.done = make(chan struct{})
	return c, nil
}

// UDPConn is a connected UDP socket of the stack: a back-arm session's
// target socket (udprelay.Target).
type UDPConn struct {
	ep    tcpip.Endpoint
	wq    waiter.Queue
	done  chan struct{}
	close sync.Once
}

var _ udprelay.Target = (*UDPConn)(nil)

// ReadDatagram implements udprelay.Target: it waits for a datagram with no
// buffer held. ICMP port unreachable (the endpoint's error event) ends the
// wait with ErrConnectionRefused, as a kernel socket's ECONNREFUSED.
func (c *UDPConn) ReadDatagram(pool *sync.Pool) (*[]byte, int, error) {
	entry, ready := waiter.NewChannelEntry(waiter.ReadableEvents | waiter.EventErr)
	c.wq.EventRegister(&entry)
	defer c.wq.EventUnregister(&entry)
	for {
		if c.ep.Readiness(waiter.ReadableEvents|waiter.EventErr|waiter.EventHUp) != 0 {
			bp := pool.Get().(*[]byte)
			w := tcpip.SliceWriter(*bp)
			res, terr := c.ep.Read(&w, tcpip.ReadOptions{})
			if terr == nil {
				return bp, res.Count, nil
			}
			pool.Put(bp)
			if _, ok := terr.(*tcpip.ErrWouldBlock); !ok {
				return nil, 0, c.err(terr)
			}
		}
		select {
		case <-ready:
		case <-c.done:
			return nil, 0, errClosedUDP
		}
	}
}

// errClosedUDP is a closed UDPConn's read or write error.
var errClosedUDP = fmt.Errorf("netstack: udp: %w", net.ErrClosed)

func (c *UDPConn) err(terr tcpip.Error) error {
	select {
	case <-c.done:
		return errClosedUDP
	default:
	}
	if _, ok := terr.(*tcpip.ErrClosedForReceive); ok {
		return errClosedUDP
	}
	return asError(terr)
}

// Write implements udprelay.Target: one datagram.
func (c *UDPConn) Write(b []byte) (int, error) {
	n, terr := c.ep.Write(bytes.NewReader(b), tcpip.WriteOptions{})
	if terr != nil {
		return 0, c.err(terr)
	}
	return int(n), nil
}

// Close implements udprelay.Target.
func (c *UDPConn) Close() error {
	c.close.Do(func() {
		close(c.done)
		c.ep.Close()
	})
	return nil
}

// DialUDP implements udprelay.Dialer: a session's target socket through the
// back arm.
func (d *StackDialer) DialUDP(_ context.Context, addr netip.AddrPort) (udprelay.Target, error) {
	if d == nil || d.Stack == nil {
		return nil, ErrNoBackArm
	}
	var nic tcpip.NICID
	if d.NIC != nil {
		nic = d.NIC.id
	}
	return d.Stack.dialUDP(nic, addr)
}
