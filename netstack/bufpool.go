package netstack

// Splice buffers, lent only while data waits
//
// A splice half that held its buffer while blocked in Read would pin
// BufferSize bytes (32 KiB) per direction for every idle connection: 64 KiB
// of the 88 KiB an idle spliced connection cost. So a half takes its
// buffer from the pool only once its source has something to read (data,
// EOF or an error), and gives it back whenever the source has nothing
// left, before it waits again. A bulk transfer keeps its buffer (the
// source stays readable between reads); an idle connection holds none.
//
// Both kinds of leg do it in proxy.Leg's ReadLent. A gVisor leg tells
// without a syscall whether it has data (readable). A host socket reads in
// a RawConn.Read callback: the buffer is taken just before the read(2) and
// given back if it finds nothing, so the read itself is the test. A one-byte MSG_PEEK before each read cost
// four extra syscalls per short connection.

import (
	"io"
	"net"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/waiter"
)

// ReadLent implements proxy.Leg: while the endpoint has nothing to read,
// bp goes back to pool and waitReadable waits without a buffer; one is
// taken for the read.
func (c *Conn) ReadLent(pool *sync.Pool, bp *[]byte) (*[]byte, int, error) {
	if bp != nil && !c.readable() {
		pool.Put(bp)
		bp = nil
	}
	if bp == nil {
		c.waitReadable()
		bp = pool.Get().(*[]byte)
	}
	n, err := c.Read(*bp)
	return bp, n, err
}

// readable reports whether a Read would not block: the endpoint has received data or is
// closed for reading (or is not connected: a Read then fails at once).
func (c *Conn) readable() bool {
	return c.ep.Readiness(waiter.ReadableEvents) != 0
}

// waitReadable blocks until a Read would not block: data, EOF, an error,
// Close, or the read deadline passing. The stack notifies the waiter queue
// on data, FIN, RST and Close; the read deadline (SetDeadline,
// SetReadDeadline) is watched here, gonet keeps its own.
func (c *Conn) waitReadable() {
	if c.readable() {
		return
	}
	entry, ch := waiter.NewChannelEntry(waiter.ReadableEvents | waiter.EventHUp | waiter.EventErr)
	c.wq.EventRegister(&entry)
	defer c.wq.EventUnregister(&entry)
	if c.readable() {
		return
	}
	var expired <-chan time.Time
	if dl := c.readDeadline.Load(); dl != nil && !dl.IsZero() {
		tm := time.NewTimer(time.Until(*dl))
		defer tm.Stop()
		expired = tm.C
	}
	select {
	case <-ch:
	case <-expired:
	}
}

// ReadLent implements proxy.Leg: the runtime's poller waits (read deadline
// included) while read(2) finds nothing, and the buffer is taken just
// before each read(2) and given back if it finds nothing.
func (c *HostConn) ReadLent(pool *sync.Pool, bp *[]byte) (*[]byte, int, error) {
	rc, err := c.raw()
	if err != nil {
		return bp, 0, err
	}
	r := &c.lent
	if r.fn == nil {
		r.fn = r.read // a method value, made once, not per read
	}
	r.pool, r.bp, r.n, r.err = pool, bp, 0, nil
	err = rc.Read(r.fn)
	bp, r.bp, r.pool = r.bp, nil, nil
	switch {
	case err != nil: // closed, or the read deadline
		return bp, 0, &net.OpError{Op: "read", Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: err}
	case r.err != nil:
		return bp, 0, &net.OpError{Op: "read", Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: os.NewSyscallError("read", r.err)}
	case r.n == 0:
		return bp, 0, io.EOF
	}
	return bp, r.n, nil
}

// lentRead is a HostConn's state for its one reader's ReadLent.
type lentRead struct {
	pool *sync.Pool
	bp   *[]byte
	n    int
	err  error
	fn   func(fd uintptr) bool // read, as a method value
}

// read is the RawConn.Read callback: false makes the poller wait for
// readability and call it again.
func (r *lentRead) read(fd uintptr) bool {
	if r.bp == nil {
		r.bp = r.pool.Get().(*[]byte)
	}
	for {
		n, err := unix.Read(int(fd), *r.bp)
		switch err {
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			r.pool.Put(r.bp)
			r.bp = nil
			return false
		}
		r.n, r.err = max(n, 0), err
		return true
	}
}
