package netstack

import (
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/waiter"

	"weir/netstack/proxy"
)

// Conn is a TCP connection terminated in a gVisor Stack: the client leg of a
// proxied connection, or a target leg dialed through a back arm. It is a
// net.Conn with CloseWrite and the endpoint's counters.
type Conn struct {
	*gonet.TCPConn
	ep *tcp.Endpoint
	wq *waiter.Queue
	// readDeadline is the last read deadline set (nil or zero: none), for
	// waitReadable; gonet keeps its own for Read.
	readDeadline atomic.Pointer[time.Time]
	// tw is the forwarder's TIME_WAIT table, for a client leg (Closing);
	// nil for a target leg.
	tw *timeWaitTable
}

// SetDeadline implements net.Conn.
func (c *Conn) SetDeadline(t time.Time) error {
	c.readDeadline.Store(&t)
	return c.TCPConn.SetDeadline(t)
}

// SetReadDeadline implements net.Conn.
func (c *Conn) SetReadDeadline(t time.Time) error {
	c.readDeadline.Store(&t)
	return c.TCPConn.SetReadDeadline(t)
}

var (
	_ proxy.Leg    = (*Conn)(nil)
	_ proxy.Client = (*Conn)(nil)
)

func newConn(wq *waiter.Queue, ep *tcp.Endpoint) *Conn {
	return &Conn{TCPConn: gonet.NewTCPConn(wq, ep), ep: ep, wq: wq}
}

// Counters implements Leg. Segment counts are the endpoint's atomic
// counters; RTT takes the endpoint's lock once.
func (c *Conn) Counters() proxy.LegCounters {
	st := c.ep.Stats().(*tcp.Stats)
	lc := proxy.LegCounters{
		SegmentsSent:     st.SegmentsSent.Value(),
		SegmentsReceived: st.SegmentsReceived.Value(),
		Retransmits:      st.SendErrors.Retransmits.Value(),
		FastRetransmits:  st.SendErrors.FastRetransmit.Value(),
		Timeouts:         st.SendErrors.Timeouts.Value(),
		TimeoutsKnown:    true,
	}
	var info tcpip.TCPInfoOption
	if err := c.ep.GetSockOpt(&info); err == nil {
		lc.RTT, lc.RTTVar = info.RTT, info.RTTVar
	}
	return lc
}

// Segments implements proxy.Client: the number of segments the connection
// sent and received (pure ACKs and retransmissions too), two atomic loads.
func (c *Conn) Segments() uint64 {
	st := c.ep.Stats().(*tcp.Stats)
	return st.SegmentsSent.Value() + st.SegmentsReceived.Value()
}

// Reset implements proxy.Client: it aborts the connection with a RST and
// closes it.
func (c *Conn) Reset() {
	c.ep.Abort()
	_ = c.Close()
}

// Closing implements proxy.Client: a client leg weir closed first goes into
// the forwarder's TIME_WAIT table (timewait.go).
func (c *Conn) Closing() {
	if c.tw != nil {
		c.tw.track(c)
	}
}

// state returns the endpoint's TCP state.
func (c *Conn) state() tcp.EndpointState { return tcp.EndpointState(c.ep.State()) }

// PeerClosed implements proxy.Client: the connection has received its
// peer's FIN (or is gone).
func (c *Conn) PeerClosed() bool { return rcvClosed(c.state()) }

// rcvClosed reports whether a connection in state st has received its
// peer's FIN (or is gone).
func rcvClosed(st tcp.EndpointState) bool {
	switch st {
	case tcp.StateCloseWait, tcp.StateLastAck, tcp.StateClosing, tcp.StateTimeWait, tcp.StateClose, tcp.StateError:
		return true
	}
	return false
}

// HostConn is a target leg over an ordinary kernel socket. Its counters come
// from TCP_INFO.
type HostConn struct {
	*net.TCPConn

	mu      sync.Mutex
	last    proxy.LegCounters // protected by mu: the last TCP_INFO read
	info    unix.TCPInfo      // protected by mu: readInfo's result
	infoErr syscall.Errno     // protected by mu: readInfo's error
	infoFn  func(fd uintptr)  // protected by mu: readInfo, made once

	rawOnce sync.Once
	rc      syscall.RawConn
	rcErr   error
	lent    lentRead // the splice's reader's (bufpool.go)
}

// raw returns the socket's RawConn, made once.
func (c *HostConn) raw() (syscall.RawConn, error) {
	c.rawOnce.Do(func() { c.rc, c.rcErr = c.TCPConn.SyscallConn() })
	return c.rc, c.rcErr
}

var _ proxy.Leg = (*HostConn)(nil)

// Counters implements Leg from the kernel's TCP_INFO: segs_out, segs_in,
// total_retrans, total_rto (kernel 6.7+), rtt and rttvar. After the socket is
// closed it returns the last values read. The getsockopt goes into the
// connection's own TCPInfo through a callback made once (x/sys's
// GetsockoptTCPInfo and a closure cost two allocations per reading).
func (c *HostConn) Counters() proxy.LegCounters {
	c.mu.Lock()
	defer c.mu.Unlock()
	rc, err := c.raw()
	if err != nil {
		return c.last
	}
	if c.infoFn == nil {
		c.infoFn = c.readInfo
	}
	if rc.Control(c.infoFn) != nil || c.infoErr != 0 {
		return c.last
	}
	info := &c.info
	c.last = proxy.LegCounters{
		SegmentsSent:     uint64(info.Segs_out),
		SegmentsReceived: uint64(info.Segs_in),
		Retransmits:      uint64(info.Total_retrans),
		Timeouts:         uint64(info.Total_rto),
		TimeoutsKnown:    kernelReportsRTO,
		RTT:              time.Duration(info.Rtt) * time.Microsecond,
		RTTVar:           time.Duration(info.Rttvar) * time.Microsecond,
		DataSegmentsIn:   uint64(info.Data_segs_in),
		DataSegmentsOut:  uint64(info.Data_segs_out),
		OutOfOrderIn:     uint64(info.Rcv_ooopack),
		Unacked:          uint64(info.Notsent_bytes) + uint64(info.Unacked)*uint64(info.Snd_mss),
	}
	return c.last
}

// readInfo is Counters' RawConn.Control callback: TCP_INFO into c.info
// (c.mu held).
func (c *HostConn) readInfo(fd uintptr) {
	l := uint32(unix.SizeofTCPInfo)
	_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, fd, unix.IPPROTO_TCP, unix.TCP_INFO,
		uintptr(unsafe.Pointer(&c.info)), uintptr(unsafe.Pointer(&l)), 0)
	c.infoErr = e
}

// kernelReportsRTO is whether this kernel fills tcpi_total_rto (6.7+).
var kernelReportsRTO = func() bool {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return false
	}
	var major, minor int
	rel := u.Release[:]
	i := 0
	for ; i < len(rel) && rel[i] >= '0' && rel[i] <= '9'; i++ {
		major = major*10 + int(rel[i]-'0')
	}
	if i < len(rel) && rel[i] == '.' {
		for i++; i < len(rel) && rel[i] >= '0' && rel[i] <= '9'; i++ {
			minor = minor*10 + int(rel[i]-'0')
		}
	}
	return major > 6 || major == 6 && minor >= 7
}()
