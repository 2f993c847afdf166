package netstack

// Splice buffers, lent only while data waits
//
// A splice half that held its buffer while blocked in Read would pin
// BufferSize bytes (32 KiB) per direction for every idle connection: 64 KiB
// of the 88 KiB an idle spliced connection cost. So a half takes its
// buffer from the pool only once its source has something to read (data,
// EOF or an error: waitReadable), and gives it back whenever the source
// has nothing left, before it waits again. A bulk transfer keeps its
// buffer (the source stays readable between reads); an idle connection
// holds none.

import (
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/waiter"
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
func (f *Forwarder) lendBuffer(src Leg, bp *[]byte) *[]byte {
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
	_ readableLeg = (*HostConn)(nil)
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

// readable implements readableLeg with a non-blocking one-byte peek.
func (c *HostConn) readable() bool {
	rc, err := c.TCPConn.SyscallConn()
	if err != nil {
		return true // Read fails at once
	}
	ready := true
	if cerr := rc.Control(func(fd uintptr) { ready = peekReady(fd) }); cerr != nil {
		return true
	}
	return ready
}

// waitReadable implements readableLeg: the runtime's poller waits (read
// deadline included) until the one-byte peek finds data, EOF or an error.
func (c *HostConn) waitReadable() {
	rc, err := c.TCPConn.SyscallConn()
	if err != nil {
		return
	}
	_ = rc.Read(peekReady)
}

// peekReady reports whether a read on fd would not block (a RawConn.Read
// callback: false makes the poller wait for readability and call again).
func peekReady(fd uintptr) bool {
	var b [1]byte
	// The raw call: unix.Recvfrom would allocate for its []byte and address.
	_, _, errno := unix.Syscall6(unix.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&b[0])), 1, unix.MSG_PEEK|unix.MSG_DONTWAIT, 0, 0)
	return errno != unix.EAGAIN && errno != unix.EINTR
}
