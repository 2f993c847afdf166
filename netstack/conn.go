package netstack

import (
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/waiter"
)

// Leg is one side of a proxied connection (the client leg or the target
// leg): a stream with half-close whose TCP counters can be read.
type Leg interface {
	net.Conn
	// CloseWrite shuts the sending direction down (sends FIN).
	CloseWrite() error
	// Counters returns the leg's TCP counters since it opened. It is safe
	// to call at any time, also after Close (it then returns the last
	// values it could read).
	Counters() LegCounters
}

// LegCounters are one TCP connection's counters as the stack that
// terminates it sees them. All counts are totals since the connection opened.
type LegCounters struct {
	SegmentsSent     uint64
	SegmentsReceived uint64
	Retransmits      uint64 // segments retransmitted, for any reason
	FastRetransmits  uint64 // segments retransmitted in fast recovery
	Timeouts         uint64 // retransmission timeouts (RTO expiries)
	// TimeoutsKnown is false where the source does not count RTO expiries
	// (a host socket on a kernel older than 6.7); Timeouts is then 0.
	TimeoutsKnown bool
	RTT           time.Duration // smoothed round-trip time
	RTTVar        time.Duration // round-trip time variation
	// DataSegmentsIn and DataSegmentsOut count the segments with payload
	// received and sent, OutOfOrderIn those received beyond the next
	// expected byte: TCP_INFO's data_segs_in, data_segs_out and
	// rcv_ooopack on a host socket; 0 on a gVisor leg, whose data segments
	// the datapath counts (see direction.go).
	DataSegmentsIn, DataSegmentsOut, OutOfOrderIn uint64
}

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

var _ Leg = (*Conn)(nil)

func newConn(wq *waiter.Queue, ep *tcp.Endpoint) *Conn {
	return &Conn{TCPConn: gonet.NewTCPConn(wq, ep), ep: ep, wq: wq}
}

// Counters implements Leg. Segment counts are the endpoint's atomic
// counters; RTT takes the endpoint's lock once.
func (c *Conn) Counters() LegCounters {
	st := c.ep.Stats().(*tcp.Stats)
	lc := LegCounters{
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

// reset aborts the connection with a RST and closes it.
func (c *Conn) reset() {
	c.ep.Abort()
	_ = c.Close()
}

// state returns the endpoint's TCP state.
func (c *Conn) state() tcp.EndpointState { return tcp.EndpointState(c.ep.State()) }

// HostConn is a target leg over an ordinary kernel socket. Its counters come
// from TCP_INFO.
type HostConn struct {
	*net.TCPConn

	mu   sync.Mutex
	last LegCounters // protected by mu: the last TCP_INFO read

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

var _ Leg = (*HostConn)(nil)

// Counters implements Leg from the kernel's TCP_INFO: segs_out, segs_in,
// total_retrans, total_rto (kernel 6.7+), rtt and rttvar. After the socket is
// closed it returns the last values read.
func (c *HostConn) Counters() LegCounters {
	c.mu.Lock()
	defer c.mu.Unlock()
	rc, err := c.raw()
	if err != nil {
		return c.last
	}
	var info *unix.TCPInfo
	var ierr error
	cerr := rc.Control(func(fd uintptr) {
		info, ierr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
	})
	if cerr != nil || ierr != nil {
		return c.last
	}
	c.last = LegCounters{
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
	}
	return c.last
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
