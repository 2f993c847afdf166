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
// A gVisor leg tells without a syscall whether it has data (readableLeg).
// A host socket reads in a RawConn.Read callback (lendingLeg): the buffer
// is taken just before the read(2) and given back if it finds nothing, so
// the read itself is the test. A one-byte MSG_PEEK before each read cost
// four extra syscalls per short connection.

import (
	"io"
	"net"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/waiter"

	"weir/netstack/proxy"
)

// readableLeg is a Leg that can tell, without reading, whether a Read would
// return at once, and wait until it would.
type readableLeg interface {
	// readable reports whether a Read would not block.
	readable() bool
	// waitReadable blocks until a Read would not block: data, EOF, an
	// error, Close, or the read deadline passing.
	waitReadable()
}

// lendBuffer returns the buffer for the next Read of src: bp itself while
// src has data waiting, otherwise bp goes back to the pool (if not nil),
// waitReadable waits, and a buffer is taken from the pool. A Leg that
// cannot wait keeps its buffer throughout. The caller gives the last buffer
// back with returnBuffer.
func (f *Forwarder) lendBuffer(src proxy.Leg, bp *[]byte) *[]byte {
	rl, ok := src.(readableLeg)
	if !ok {
		if bp == nil {
			bp = f.bufPool.Get().(*[]byte)
		}
		return bp
	}
	if bp != nil {
		if rl.readable() {
			return bp
		}
		f.bufPool.Put(bp)
	}
	rl.waitReadable()
	return f.bufPool.Get().(*[]byte)
}

// returnBuffer gives bp back to the pool; nil is allowed.
func (f *Forwarder) returnBuffer(bp *[]byte) {
	if bp != nil {
		f.bufPool.Put(bp)
	}
}

var (
	_ readableLeg = (*Conn)(nil)
)

// readable implements readableLeg: the endpoint has received data or is
// closed for reading (or is not connected: a Read then fails at once).
func (c *Conn) readable() bool {
	return c.ep.Readiness(waiter.ReadableEvents) != 0
}

// waitReadable implements readableLeg. The stack notifies the waiter queue
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

// lendingLeg is a Leg that reads into a buffer from a pool it takes only
// once data (or EOF, or an error) is there to read.
type lendingLeg interface {
	// readLent reads like Read into *bp, or, with bp nil, into a buffer
	// from pool taken for the read; while the source has nothing to read
	// it holds no buffer (bp goes back to pool). It returns the buffer it
	// holds: not nil when n > 0.
	readLent(pool *sync.Pool, bp *[]byte) (_ *[]byte, n int, err error)
}

var _ lendingLeg = (*HostConn)(nil)

// readLent implements lendingLeg: the runtime's poller waits (read
// deadline included) while read(2) finds nothing.
func (c *HostConn) readLent(pool *sync.Pool, bp *[]byte) (*[]byte, int, error) {
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

// lentRead is a HostConn's state for its one reader's readLent.
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
