package netstack

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv6"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/icmp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"
	"gvisor.dev/gvisor/pkg/waiter"

	"weir/datapath"
)

// Defaults applied where an Options or NICOptions field is zero.
const (
	// DefaultMinRTO is the smallest retransmission timeout. Linux and gVisor
	// use 200 ms, made for the Internet; on a LAN with sub-millisecond RTTs a
	// lost tail segment would then stall a connection for 200 ms. Measured
	// with TestLossRatio (2 × 8 MiB per leg through memory pairs, on a
	// shared 2-core machine): at 5 ms clean legs took spurious RTOs (1-3 per
	// 12 000 segments), at 20 ms 0-1, at 50 and 200 ms none; 20 ms keeps a
	// timeout meaning a real loss while recovering a lost tail 10× sooner
	// than the Internet default.
	DefaultMinRTO = 20 * time.Millisecond
	// DefaultMaxRTO caps the exponential backoff of retransmissions.
	DefaultMaxRTO = 10 * time.Second
	// DefaultReceiveBuffer and DefaultSendBuffer are the initial per-endpoint
	// buffer sizes; receive-buffer moderation grows the receive buffer up to
	// DefaultMaxBuffer as a connection's bandwidth-delay product requires.
	DefaultReceiveBuffer = 256 << 10
	DefaultSendBuffer    = 256 << 10
	DefaultMaxBuffer     = 4 << 20
	// DefaultTimeWait is how long a connection weir closed first stays in
	// TIME_WAIT. A new SYN on the same 4-tuple reopens it at once (see
	// timewait.go), so TIME_WAIT's one remaining job is to acknowledge the
	// client's FIN again should weir's last ACK be lost: the client
	// retransmits it after its RTO, at least 200 ms on Linux (RFC 6298's
	// 1 s elsewhere, which this does not cover). 250 ms covers a nearby
	// Linux client's first retransmission; a later FIN gets a RST, which a
	// client in LAST_ACK takes as the end it was waiting for, its data all
	// delivered and acknowledged. A gVisor endpoint in TIME_WAIT costs
	// about 6 KiB, so TIME_WAIT holds 6 KiB × connections/s × duration:
	// with weirbench's server-closes-first load at ~4 000 connections/s,
	// 30 s held 225 MiB peak RSS, 1 s 84 MiB and 250 ms 59 MiB (the client
	// closing first: 44 MiB).
	DefaultTimeWait = 250 * time.Millisecond
	// DefaultKeepaliveIdle, DefaultKeepaliveInterval and
	// DefaultKeepaliveCount detect a vanished client or target: after 60 s
	// of silence, 3 probes 10 s apart.
	DefaultKeepaliveIdle     = 60 * time.Second
	DefaultKeepaliveInterval = 10 * time.Second
	DefaultKeepaliveCount    = 3
	// DefaultWriteQueueLen is the number of egress packets a link queues for
	// its device before it drops.
	DefaultWriteQueueLen = 2048
)

// Options configure a Stack. The zero value works: every zero field takes the
// default named in its comment.
type Options struct {
	// MinRTO is the smallest retransmission timeout; zero means
	// DefaultMinRTO (20 ms).
	MinRTO time.Duration
	// MaxRTO is the largest; zero means DefaultMaxRTO (10 s).
	MaxRTO time.Duration
	// ReceiveBuffer is the initial TCP receive buffer in bytes; zero means
	// DefaultReceiveBuffer. Moderation grows it up to MaxBuffer.
	ReceiveBuffer int
	// SendBuffer is the initial TCP send buffer in bytes; zero means
	// DefaultSendBuffer.
	SendBuffer int
	// MaxBuffer is the largest either buffer grows to; zero means
	// DefaultMaxBuffer (4 MiB).
	MaxBuffer int
	// TimeWait is the TIME_WAIT duration; zero means DefaultTimeWait.
	TimeWait time.Duration
	// DisableSACK turns selective acknowledgements off; the zero value keeps
	// them on.
	DisableSACK bool
	// DisableRACK uses classic duplicate-ACK loss detection instead of RACK;
	// the zero value keeps RACK on.
	DisableRACK bool
	// KeepaliveIdle, KeepaliveInterval and KeepaliveCount configure TCP
	// keepalive on the connections weir accepts and dials; zero means the
	// Default values. A negative KeepaliveIdle turns keepalive off.
	KeepaliveIdle     time.Duration
	KeepaliveInterval time.Duration
	KeepaliveCount    int
}

func (o Options) withDefaults() Options {
	if o.MinRTO <= 0 {
		o.MinRTO = DefaultMinRTO
	}
	if o.MaxRTO <= 0 {
		o.MaxRTO = DefaultMaxRTO
	}
	if o.ReceiveBuffer <= 0 {
		o.ReceiveBuffer = DefaultReceiveBuffer
	}
	if o.SendBuffer <= 0 {
		o.SendBuffer = DefaultSendBuffer
	}
	if o.MaxBuffer <= 0 {
		o.MaxBuffer = DefaultMaxBuffer
	}
	if o.MaxBuffer < o.ReceiveBuffer {
		o.MaxBuffer = o.ReceiveBuffer
	}
	if o.MaxBuffer < o.SendBuffer {
		o.MaxBuffer = o.SendBuffer
	}
	if o.TimeWait <= 0 {
		o.TimeWait = DefaultTimeWait
	}
	if o.KeepaliveIdle == 0 {
		o.KeepaliveIdle = DefaultKeepaliveIdle
	}
	if o.KeepaliveInterval <= 0 {
		o.KeepaliveInterval = DefaultKeepaliveInterval
	}
	if o.KeepaliveCount <= 0 {
		o.KeepaliveCount = DefaultKeepaliveCount
	}
	return o
}

// Stack is a gVisor TCP/IP stack (IPv4, IPv6, TCP, UDP, ICMP) with weir's
// tuning, on NICs that bridge datapath.Devices. It is safe for concurrent
// use.
type Stack struct {
	s    *stack.Stack
	opts Options

	mu      sync.Mutex
	nics    []*NIC       // protected by mu
	synHook *func(twKey) // protected by mu; installed on new NICs
	close   sync.Once
}

// New builds a Stack with no NIC.
func New(opts Options) (*Stack, error) {
	opts = opts.withDefaults()
	s := stack.New(stack.Options{
		NetworkProtocols:   []stack.NetworkProtocolFactory{ipv4.NewProtocol, ipv6.NewProtocol},
		TransportProtocols: []stack.TransportProtocolFactory{tcp.NewProtocol, udp.NewProtocol, icmp.NewProtocol4, icmp.NewProtocol6},
		HandleLocal:        false,
	})
	sack := tcpip.TCPSACKEnabled(!opts.DisableSACK)
	recovery := tcpip.TCPRACKLossDetection
	if opts.DisableRACK {
		recovery = 0
	}
	moderate := tcpip.TCPModerateReceiveBufferOption(true)
	minRTO := tcpip.TCPMinRTOOption(opts.MinRTO)
	maxRTO := tcpip.TCPMaxRTOOption(opts.MaxRTO)
	tw := tcpip.TCPTimeWaitTimeoutOption(opts.TimeWait)
	rcv := tcpip.TCPReceiveBufferSizeRangeOption{Min: 4096, Default: opts.ReceiveBuffer, Max: opts.MaxBuffer}
	snd := tcpip.TCPSendBufferSizeRangeOption{Min: 4096, Default: opts.SendBuffer, Max: opts.MaxBuffer}
	for _, o := range []tcpip.SettableTransportProtocolOption{&sack, &recovery, &moderate, &minRTO, &maxRTO, &tw, &rcv, &snd} {
		if err := s.SetTransportProtocolOption(tcp.ProtocolNumber, o); err != nil {
			s.Close()
			return nil, fmt.Errorf("netstack: tcp option %T: %s", o, err)
		}
	}
	return &Stack{s: s, opts: opts}, nil
}

// NICOptions configure one NIC. The zero value works: a NIC with no address
// that answers for nothing.
type NICOptions struct {
	// Name names the NIC in errors; empty means "nic<id>".
	Name string
	// Addrs are the NIC's own addresses with their prefixes, used as source
	// addresses when dialing. Empty: none (a front NIC needs none).
	Addrs []netip.Prefix
	// Routes are the destinations reached through this NIC. Nil means
	// everything (0.0.0.0/0 and ::/0). More specific routes win across NICs.
	Routes []netip.Prefix
	// Promiscuous makes the NIC accept packets for any destination address
	// and answer from it (promiscuous mode and spoofing): the front NIC
	// answers for every VIP without the VIPs being configured as addresses.
	Promiscuous bool
	// Headroom is the number of bytes reserved before each packet for the
	// device's own header (offset in datapath.Device); zero means none.
	Headroom int
	// WriteQueueLen is the number of egress packets queued for the device
	// before drops; zero means DefaultWriteQueueLen.
	WriteQueueLen int
}

// NIC is one network interface of a Stack, bridging a datapath.Device.
type NIC struct {
	id   tcpip.NICID
	name string
	link *linkEndpoint
}

// Stats returns the NIC's link counters.
func (n *NIC) Stats() LinkStats { return n.link.stats() }

// ID returns the NIC's identifier in its stack.
func (n *NIC) ID() int { return int(n.id) }

// AddNIC attaches dev to the stack as a new NIC and starts its reader and
// writer goroutines. The stack owns dev from now on: Close closes it.
func (s *Stack) AddNIC(dev datapath.Device, o NICOptions) (*NIC, error) {
	if dev.MTU() <= 0 {
		return nil, fmt.Errorf("netstack: device MTU %d", dev.MTU())
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	id := tcpip.NICID(len(s.nics) + 1)
	name := o.Name
	if name == "" {
		name = fmt.Sprintf("nic%d", id)
	}
	le := newLinkEndpoint(dev, o.Headroom, o.WriteQueueLen)
	if err := s.s.CreateNICWithOptions(id, le, stack.NICOptions{Name: name}); err != nil {
		return nil, fmt.Errorf("netstack: create NIC %s: %s", name, err)
	}
	fail := func(what string, err tcpip.Error) (*NIC, error) {
		s.s.RemoveNIC(id)
		return nil, fmt.Errorf("netstack: NIC %s: %s: %s", name, what, err)
	}
	if o.Promiscuous {
		if err := s.s.SetPromiscuousMode(id, true); err != nil {
			return fail("promiscuous mode", err)
		}
		if err := s.s.SetSpoofing(id, true); err != nil {
			return fail("spoofing", err)
		}
	}
	for _, p := range o.Addrs {
		pa := tcpip.ProtocolAddress{
			Protocol:          protoOf(p.Addr()),
			AddressWithPrefix: tcpip.AddressWithPrefix{Address: tcpAddr(p.Addr()), PrefixLen: p.Bits()},
		}
		if err := s.s.AddProtocolAddress(id, pa, stack.AddressProperties{}); err != nil {
			return fail("address "+p.String(), err)
		}
	}
	routes := o.Routes
	if routes == nil {
		routes = []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")}
	}
	for _, r := range routes {
		r = r.Masked()
		sub, err := tcpip.NewSubnet(tcpAddr(r.Addr()), tcpip.MaskFromBytes(net.CIDRMask(r.Bits(), r.Addr().BitLen())))
		if err != nil {
			s.s.RemoveNIC(id)
			return nil, fmt.Errorf("netstack: NIC %s: route %v: %w", name, r, err)
		}
		s.s.AddRoute(tcpip.Route{Destination: sub, NIC: id})
	}
	le.synHook.Store(s.synHook)
	n := &NIC{id: id, name: name, link: le}
	s.nics = append(s.nics, n)
	return n, nil
}

// Close removes every NIC (closing its device and stopping its goroutines)
// and closes the stack. Open endpoints are aborted. It is safe to call more
// than once.
func (s *Stack) Close() error {
	s.close.Do(func() {
		s.mu.Lock()
		nics := s.nics
		s.mu.Unlock()
		// Stopping the links first (closing their devices and waiting for
		// their goroutines, with no stack lock held) stops traffic; then the
		// stack aborts its endpoints and waits for its own goroutines.
		for _, n := range nics {
			n.link.shutdown()
		}
		s.s.Close()
		s.s.Wait()
	})
	return nil
}

// DialTCP opens a TCP connection to addr through the stack, bound to local
// if local is valid (a zero AddrPort means any address and port). The
// returned Conn carries the endpoint's statistics.
func (s *Stack) DialTCP(ctx context.Context, local, addr netip.AddrPort) (*Conn, error) {
	return s.dialTCP(ctx, 0, local, addr)
}

// dialTCP is DialTCP through the NIC with ID nic (0: the route table's
// choice).
func (s *Stack) dialTCP(ctx context.Context, nic tcpip.NICID, local, addr netip.AddrPort) (*Conn, error) {
	addr = netip.AddrPortFrom(addr.Addr().Unmap(), addr.Port())
	proto := protoOf(addr.Addr())
	var wq waiter.Queue
	ep, terr := s.s.NewEndpoint(tcp.ProtocolNumber, proto, &wq)
	if terr != nil {
		return nil, fmt.Errorf("netstack: dial %v: %w", addr, asError(terr))
	}
	s.setKeepalive(ep)
	if local.IsValid() {
		if terr := ep.Bind(fullAddr(local)); terr != nil {
			ep.Close()
			return nil, fmt.Errorf("netstack: dial %v: bind %v: %w", addr, local, asError(terr))
		}
	}
	entry, ch := waiter.NewChannelEntry(waiter.WritableEvents)
	wq.EventRegister(&entry)
	defer wq.EventUnregister(&entry)
	remote := fullAddr(addr)
	remote.NIC = nic
	terr = ep.Connect(remote)
	if _, ok := terr.(*tcpip.ErrConnectStarted); ok {
		select {
		case <-ctx.Done():
			ep.Abort()
			ep.Close()
			return nil, fmt.Errorf("netstack: dial %v: %w", addr, ctx.Err())
		case <-ch:
		}
		terr = ep.LastError()
	}
	if terr != nil {
		ep.Close()
		return nil, &net.OpError{Op: "dial", Net: "tcp", Addr: net.TCPAddrFromAddrPort(addr), Err: asError(terr)}
	}
	return newConn(&wq, ep.(*tcp.Endpoint)), nil
}

// ListenTCP listens on addr through the stack (a target server on a back
// arm, or a test). The addr must be one of a NIC's addresses, or the
// unspecified address.
func (s *Stack) ListenTCP(addr netip.AddrPort) (net.Listener, error) {
	addr = netip.AddrPortFrom(addr.Addr().Unmap(), addr.Port())
	fa := fullAddr(addr)
	if addr.Addr().IsUnspecified() {
		fa.Addr = tcpip.Address{}
	}
	l, err := gonet.ListenTCP(s.s, fa, protoOf(addr.Addr()))
	if err != nil {
		return nil, fmt.Errorf("netstack: listen %v: %w", addr, err)
	}
	return l, nil
}

// StackStats are stack-wide counters.
type StackStats struct {
	TCPResetsSent        uint64 // RSTs sent, for any reason
	TCPSegmentsSent      uint64 // TCP segments sent, retransmissions included
	TCPRetransmits       uint64 // TCP segments retransmitted
	TCPTimeouts          uint64 // retransmission timeouts (RTO expiries)
	TCPForwardDropFull   uint64 // SYNs dropped because MaxInFlight handshakes were pending
	UDPUnknownPort       uint64 // UDP datagrams to no socket (answered with ICMP unreachable)
	ICMPUnreachablesSent uint64 // ICMPv4 and ICMPv6 destination-unreachable messages sent
	IPMalformed          uint64 // IP packets dropped as malformed
	TCPChecksumErrors    uint64 // TCP segments dropped for a bad checksum
	// IPFragmentsRefused counts fragments reassembly refused: overlapping
	// (RFC 5722: the whole datagram goes), conflicting last fragments, or
	// past 64 KiB. Tiny fragments never get here: the datapath drops them
	// (reason tiny_fragment).
	IPFragmentsRefused uint64
}

// Stats returns stack-wide counters.
func (s *Stack) Stats() StackStats {
	st := s.s.Stats()
	return StackStats{
		TCPResetsSent:        st.TCP.ResetsSent.Value(),
		TCPSegmentsSent:      st.TCP.SegmentsSent.Value(),
		TCPRetransmits:       st.TCP.Retransmits.Value(),
		TCPTimeouts:          st.TCP.Timeouts.Value(),
		TCPForwardDropFull:   st.TCP.ForwardMaxInFlightDrop.Value(),
		UDPUnknownPort:       st.UDP.UnknownPortErrors.Value(),
		ICMPUnreachablesSent: st.ICMP.V4.PacketsSent.DstUnreachable.Value() + st.ICMP.V6.PacketsSent.DstUnreachable.Value(),
		IPMalformed:          st.IP.MalformedPacketsReceived.Value(),
		TCPChecksumErrors:    st.TCP.ChecksumErrors.Value(),
		IPFragmentsRefused:   st.IP.MalformedFragmentsReceived.Value(),
	}
}

func (s *Stack) setKeepalive(ep tcpip.Endpoint) {
	if s.opts.KeepaliveIdle < 0 {
		return
	}
	idle := tcpip.KeepaliveIdleOption(s.opts.KeepaliveIdle)
	intv := tcpip.KeepaliveIntervalOption(s.opts.KeepaliveInterval)
	_ = ep.SetSockOpt(&idle)
	_ = ep.SetSockOpt(&intv)
	_ = ep.SetSockOptInt(tcpip.KeepaliveCountOption, s.opts.KeepaliveCount)
	ep.SocketOptions().SetKeepAlive(true)
}

// errTCPIP carries a tcpip.Error's text across the package edge.
type errTCPIP struct{ msg string }

func (e *errTCPIP) Error() string { return e.msg }

// Errors a tcpip.Error is converted to where callers may test for them.
var (
	// ErrConnectionRefused is returned by a dial the peer answered with RST.
	ErrConnectionRefused = errors.New("connection refused")
	// ErrTimeout is returned by a dial or handshake that timed out.
	ErrTimeout = errors.New("timed out")
	// ErrConnectionReset is returned by a dial whose connection the peer
	// reset right after the handshake (weir refusing it).
	ErrConnectionReset = errors.New("connection reset by peer")
)

// asError converts a tcpip.Error into an error; it is the only way a
// tcpip.Error leaves the package.
func asError(e tcpip.Error) error {
	switch e.(type) {
	case nil:
		return nil
	case *tcpip.ErrConnectionRefused:
		return ErrConnectionRefused
	case *tcpip.ErrTimeout:
		return ErrTimeout
	case *tcpip.ErrConnectionReset:
		return ErrConnectionReset
	}
	return &errTCPIP{e.String()}
}

func protoOf(a netip.Addr) tcpip.NetworkProtocolNumber {
	if a.Unmap().Is4() {
		return header.IPv4ProtocolNumber
	}
	return header.IPv6ProtocolNumber
}

func tcpAddr(a netip.Addr) tcpip.Address {
	a = a.Unmap()
	if a.Is4() {
		return tcpip.AddrFrom4(a.As4())
	}
	return tcpip.AddrFrom16(a.As16())
}

func fullAddr(ap netip.AddrPort) tcpip.FullAddress {
	return tcpip.FullAddress{Addr: tcpAddr(ap.Addr()), Port: ap.Port()}
}

func netipAddr(a tcpip.Address) netip.Addr {
	if a.Len() == 4 {
		return netip.AddrFrom4(a.As4())
	}
	if a.Len() == 16 {
		return netip.AddrFrom16(a.As16())
	}
	return netip.Addr{}
}

// setSYNHook installs (or, with nil, removes) the pure-SYN hook on every NIC,
// present and future.
func (s *Stack) setSYNHook(h *func(twKey)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.synHook = h
	for _, n := range s.nics {
		n.link.synHook.Store(h)
	}
}
