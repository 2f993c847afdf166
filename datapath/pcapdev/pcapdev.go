// Package pcapdev records weir's datapath into pcap capture files: a
// Recorder wraps any Device and writes everything read from or written to
// it into a Capture (link type RAW: bare IPv4/IPv6 packets), which
// Wireshark and tcpdump open directly. `weir run --capture FILE` records
// its front NIC this way: one Capture, bounded in size, shared by a
// Recorder per TUN queue.
//
// Flow
//
//	Recorder.Read:   inner.Read ─► each packet appended to the capture ─► caller
//	Recorder.Write:  each packet appended to the capture ─► inner.Write
//	Capture:         buffered, flushed every FlushEvery; past MaxBytes: counted, not written
//
// The Capture serialises writes on a mutex and buffers them: recording is
// a debugging tool an operator turns on, not meant to sit on the fast path
// of a loaded appliance (once MaxBytes is reached it costs one atomic
// load per packet).
package pcapdev

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"weir/datapath"
)

// CaptureOptions configure CreateCapture. The zero value works.
type CaptureOptions struct {
	// Snaplen is the most bytes of each packet recorded; zero means the
	// whole packet (up to 65535).
	Snaplen int
	// MaxBytes bounds the capture: once the next record would take the
	// file past MaxBytes, recording stops for good (traffic still passes)
	// and every packet after is counted in Missed. Zero means no bound.
	MaxBytes int64
	// FlushEvery is the longest a record waits in the buffer before it is
	// written out, so that a capture can be read while it grows; zero
	// means one second.
	FlushEvery time.Duration
	// Now is the clock for packet timestamps; nil means time.Now.
	Now func() time.Time
}

// The pcap file format (libpcap's, as tcpdump writes it: a file header,
// then a record header before each packet), in the nanosecond-resolution
// variant, little-endian. It is written here rather than with gopacket's
// pcapgo: importing that pulls in gopacket/layers, whose init fills some
// 7 MiB of lookup tables, resident in every weir run whether it captures
// or not (RssAnon 0.6 against 7.6 MiB for a program that imports only
// it). The tests read the files back with pcapgo and tcpdump.
const (
	fileHeaderLen   = 24
	recordHeaderLen = 16

	magicNanos   = 0xa1b23c4d // nanosecond timestamps
	versionMajor = 2
	versionMinor = 4
	linkTypeRaw  = 101 // LINKTYPE_RAW: the packet begins with its IPv4 or IPv6 header
)

// appendFileHeader appends the pcap file header for snaplen.
func appendFileHeader(b []byte, snaplen int) []byte {
	b = binary.LittleEndian.AppendUint32(b, magicNanos)
	b = binary.LittleEndian.AppendUint16(b, versionMajor)
	b = binary.LittleEndian.AppendUint16(b, versionMinor)
	b = binary.LittleEndian.AppendUint32(b, 0) // thiszone: UTC
	b = binary.LittleEndian.AppendUint32(b, 0) // sigfigs
	b = binary.LittleEndian.AppendUint32(b, uint32(snaplen))
	return binary.LittleEndian.AppendUint32(b, linkTypeRaw)
}

// appendRecordHeader appends a record's header: its time, the bytes
// recorded and the packet's length.
func appendRecordHeader(b []byte, t time.Time, captured, length int) []byte {
	b = binary.LittleEndian.AppendUint32(b, uint32(t.Unix()))
	b = binary.LittleEndian.AppendUint32(b, uint32(t.Nanosecond()))
	b = binary.LittleEndian.AppendUint32(b, uint32(captured))
	return binary.LittleEndian.AppendUint32(b, uint32(length))
}

// Capture is a pcap capture of link type RAW being written (bare IPv4 and
// IPv6 packets, nanosecond timestamps), which tcpdump -r and Wireshark
// open directly. Several Recorders may share one Capture (one per TUN
// queue): records are serialised on a mutex and buffered.
type Capture struct {
	opts CaptureOptions

	mu        sync.Mutex // guards everything below but the atomics
	bw        *bufio.Writer
	hdr       [recordHeaderLen]byte // the record header being written
	closer    io.Closer
	bytes     int64     // written to the capture, file header included
	lastFlush time.Time // when bw was last flushed
	err       error     // first write error; recording stops after it
	closed    bool

	stopped          atomic.Bool // MaxBytes reached, an error or Close: record nothing more
	recorded, missed atomic.Uint64
}

// CaptureStats are what a capture recorded and what it could not.
type CaptureStats struct {
	Recorded uint64 // packets written
	Missed   uint64 // packets not written: MaxBytes reached, or after a write error
	Bytes    int64  // size of the capture, file header included
}

// newCapture writes a pcap file header to w. If w is an io.Closer, Close
// closes it.
func newCapture(w io.Writer, o CaptureOptions) (*Capture, error) {
	if o.Snaplen <= 0 || o.Snaplen > 65535 {
		o.Snaplen = 65535
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.FlushEvery <= 0 {
		o.FlushEvery = time.Second
	}
	if o.MaxBytes > 0 && o.MaxBytes < fileHeaderLen {
		return nil, fmt.Errorf("pcap capture: MaxBytes %d is smaller than the file header (%d bytes)", o.MaxBytes, fileHeaderLen)
	}
	bw := bufio.NewWriterSize(w, 64<<10)
	// The header goes out at once: the file is a valid, empty capture
	// from the start.
	bw.Write(appendFileHeader(make([]byte, 0, fileHeaderLen), o.Snaplen))
	if err := bw.Flush(); err != nil {
		return nil, fmt.Errorf("pcap capture: %w", err)
	}
	c := &Capture{opts: o, bw: bw, bytes: fileHeaderLen, lastFlush: o.Now()}
	if cl, ok := w.(io.Closer); ok {
		c.closer = cl
	}
	return c, nil
}

// CreateCapture creates (or truncates) the file at path, readable and
// writable by its owner only (a capture holds the traffic's payload), and
// starts a capture in it.
func CreateCapture(path string, o CaptureOptions) (*Capture, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, err
	}
	// An existing file keeps its mode through O_TRUNC: narrow it.
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return nil, err
	}
	c, err := newCapture(f, o)
	if err != nil {
		f.Close()
		return nil, err
	}
	return c, nil
}

// record appends one packet, or counts it missed.
func (c *Capture) record(p []byte) {
	if c.stopped.Load() {
		c.missed.Add(1)
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || c.err != nil {
		c.missed.Add(1)
		return
	}
	now := c.opts.Now()
	captured := min(len(p), c.opts.Snaplen)
	size := int64(recordHeaderLen + captured)
	if c.opts.MaxBytes > 0 && c.bytes+size > c.opts.MaxBytes {
		c.stopped.Store(true)
		c.missed.Add(1)
		c.bw.Flush()
		return
	}
	c.bw.Write(appendRecordHeader(c.hdr[:0], now, captured, len(p)))
	if _, err := c.bw.Write(p[:captured]); err != nil {
		c.err = err
		c.stopped.Store(true)
		c.missed.Add(1)
		return
	}
	c.bytes += size
	c.recorded.Add(1)
	if now.Sub(c.lastFlush) >= c.opts.FlushEvery {
		c.lastFlush = now
		if err := c.bw.Flush(); err != nil {
			c.err = err
			c.stopped.Store(true)
		}
	}
}

// Wrap returns a Recorder that passes everything through to inner and
// records it in c. Closing the Recorder closes inner, not c.
func (c *Capture) Wrap(inner datapath.Device) *Recorder {
	return &Recorder{inner: inner, c: c}
}

// Flush writes buffered records to the underlying writer.
func (c *Capture) Flush() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return c.err
	}
	if c.closed {
		return nil
	}
	return c.bw.Flush()
}

// Stats returns what c recorded so far.
func (c *Capture) Stats() CaptureStats {
	c.mu.Lock()
	n := c.bytes
	c.mu.Unlock()
	return CaptureStats{Recorded: c.recorded.Load(), Missed: c.missed.Load(), Bytes: n}
}

// Err returns the first error writing the capture, after which recording
// stopped (traffic still passes).
func (c *Capture) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Close flushes the capture and closes its writer when that is an
// io.Closer; packets after it are counted missed. A second Close does
// nothing.
func (c *Capture) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	c.stopped.Store(true)
	err := c.err
	if err == nil {
		err = c.bw.Flush()
	}
	if c.closer != nil {
		if cerr := c.closer.Close(); err == nil {
			err = cerr
		}
	}
	return err
}

// Recorder is a datapath.Device that passes everything through to an
// inner device and records it in a Capture.
type Recorder struct {
	inner datapath.Device
	c     *Capture
}

var (
	_ datapath.Device        = (*Recorder)(nil)
	_ datapath.StatsReporter = (*Recorder)(nil)
)

// Read implements datapath.Device: it reads from the inner device and
// records what it returns.
func (r *Recorder) Read(bufs [][]byte, sizes []int, offset int) (int, error) {
	n, err := r.inner.Read(bufs, sizes, offset)
	for i := range n {
		r.c.record(bufs[i][offset : offset+sizes[i]])
	}
	return n, err
}

// Write implements datapath.Device: it records the packets, then writes
// them to the inner device.
func (r *Recorder) Write(bufs [][]byte, offset int) (int, error) {
	for _, b := range bufs {
		if offset <= len(b) {
			r.c.record(b[offset:])
		}
	}
	return r.inner.Write(bufs, offset)
}

// Unwrap returns the device r records, for callers that look for its own
// methods (a TUN's kernel counters).
func (r *Recorder) Unwrap() datapath.Device { return r.inner }

// BatchSize implements datapath.Device.
func (r *Recorder) BatchSize() int { return r.inner.BatchSize() }

// MTU implements datapath.Device.
func (r *Recorder) MTU() int { return r.inner.MTU() }

// Stats implements datapath.StatsReporter with the inner device's
// counters (zero when it keeps none).
func (r *Recorder) Stats() datapath.DeviceStats {
	if sr, ok := r.inner.(datapath.StatsReporter); ok {
		return sr.Stats()
	}
	return datapath.DeviceStats{}
}

// Close implements datapath.Device: it closes the inner device and flushes
// the capture, which stays open for the other recorders sharing it (its
// owner closes it).
func (r *Recorder) Close() error {
	err := r.inner.Close()
	if ferr := r.c.Flush(); err == nil {
		err = ferr
	}
	return err
}
