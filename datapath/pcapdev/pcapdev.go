// Package pcapdev connects weir's datapath to pcap capture files: Replay
// is a datapath.Device whose input is a capture, and Recorder wraps any
// Device and writes everything read from or written to it into a Capture
// (link type RAW: bare IPv4/IPv6 packets), which Wireshark and tcpdump
// open directly. `weir run --capture FILE` records its front NIC this way:
// one Capture, bounded in size, shared by a Recorder per TUN queue.
//
// Flow
//
//	Replay.Read:     pcap record ─► strip link header (Ethernet, Linux SLL) ─► caller's buffer
//	                 end of file ─► 0, os.ErrClosed (or start over, Loops times)
//	Replay.Write:    counted and discarded
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
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/google/gopacket/pcapgo"

	"weir/datapath"
)

// ReplayOptions configure NewReplay. The zero value works.
type ReplayOptions struct {
	// MTU is what MTU reports and the largest packet Read returns; zero
	// means 65535. Longer packets are dropped and counted.
	MTU int
	// BatchSize is the most packets one Read returns; zero means 64.
	BatchSize int
	// Loops is how many more times the capture is replayed after the
	// first pass, for an io.ReadSeeker source; zero means once.
	Loops int
}

// Replay is a datapath.Device that reads its input from a pcap capture.
// Read is meant for one goroutine at a time; Write, which discards, may be
// called from any.
type Replay struct {
	opts  ReplayOptions
	src   io.Reader
	mu    sync.Mutex // guards r, loops, closed
	r     *pcapgo.Reader
	link  layers.LinkType
	loops int

	closed atomic.Bool
	stats  struct {
		rxPackets, rxBytes, txPackets, txBytes, tooBig, skipped atomic.Uint64
	}
}

var (
	_ datapath.Device        = (*Replay)(nil)
	_ datapath.StatsReporter = (*Replay)(nil)
)

// NewReplay returns a device replaying the capture read from src. The
// capture's link type must be RAW, IPv4, IPv6, Ethernet or Linux SLL.
func NewReplay(src io.Reader, o ReplayOptions) (*Replay, error) {
	if o.MTU <= 0 {
		o.MTU = 65535
	}
	if o.BatchSize <= 0 {
		o.BatchSize = 64
	}
	r, err := pcapgo.NewReader(src)
	if err != nil {
		return nil, fmt.Errorf("pcap replay: %w", err)
	}
	switch lt := r.LinkType(); lt {
	case layers.LinkTypeRaw, layers.LinkTypeIPv4, layers.LinkTypeIPv6, layers.LinkTypeEthernet, layers.LinkTypeLinuxSLL:
	default:
		return nil, fmt.Errorf("pcap replay: unsupported link type %v", lt)
	}
	return &Replay{opts: o, src: src, r: r, link: r.LinkType(), loops: o.Loops}, nil
}

// OpenReplay opens the capture file at path; Close closes the file.
func OpenReplay(path string, o ReplayOptions) (*Replay, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	d, err := NewReplay(f, o)
	if err != nil {
		f.Close()
		return nil, err
	}
	return d, nil
}

// ipPayload returns the IP packet inside a frame of link type lt, or nil
// when the frame carries something else.
func ipPayload(lt layers.LinkType, frame []byte) []byte {
	var typ uint16
	switch lt {
	case layers.LinkTypeRaw, layers.LinkTypeIPv4, layers.LinkTypeIPv6:
		return frame
	case layers.LinkTypeEthernet:
		if len(frame) < 14 {
			return nil
		}
		typ, frame = binary.BigEndian.Uint16(frame[12:14]), frame[14:]
		if typ == 0x8100 && len(frame) >= 4 { // one VLAN tag
			typ, frame = binary.BigEndian.Uint16(frame[2:4]), frame[4:]
		}
	case layers.LinkTypeLinuxSLL:
		if len(frame) < 16 {
			return nil
		}
		typ, frame = binary.BigEndian.Uint16(frame[14:16]), frame[16:]
	}
	if typ == 0x0800 || typ == 0x86dd {
		return frame
	}
	return nil
}

// Read implements datapath.Device: it returns the next packets of the
// capture, at most BatchSize, and 0, os.ErrClosed once the capture (and
// its loops) is exhausted or the device is closed. Frames that carry no IP
// packet are skipped and counted.
func (d *Replay) Read(bufs [][]byte, sizes []int, offset int) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := 0
	limit := min(len(bufs), d.opts.BatchSize)
	for n < limit {
		if d.closed.Load() {
			break
		}
		frame, _, err := d.r.ZeroCopyReadPacketData()
		if err != nil {
			if errors.Is(err, io.EOF) && d.rewind() {
				continue
			}
			if n == 0 {
				if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
					return 0, os.ErrClosed
				}
				return 0, fmt.Errorf("pcap replay: %w", err)
			}
			break
		}
		p := ipPayload(d.link, frame)
		if p == nil {
			d.stats.skipped.Add(1)
			continue
		}
		if len(p) > d.opts.MTU || offset > len(bufs[n]) || len(p) > len(bufs[n])-offset {
			d.stats.tooBig.Add(1)
			continue
		}
		sizes[n] = copy(bufs[n][offset:], p)
		d.stats.rxBytes.Add(uint64(len(p)))
		n++
	}
	if n == 0 {
		return 0, os.ErrClosed
	}
	d.stats.rxPackets.Add(uint64(n))
	return n, nil
}

// rewind starts the capture over when loops remain; d.mu is held.
func (d *Replay) rewind() bool {
	s, ok := d.src.(io.Seeker)
	if !ok || d.loops == 0 {
		return false
	}
	if _, err := s.Seek(0, io.SeekStart); err != nil {
		return false
	}
	r, err := pcapgo.NewReader(d.src)
	if err != nil {
		return false
	}
	d.loops--
	d.r = r
	return true
}

// Write implements datapath.Device: a replay has no output, so it counts
// the packets and discards them.
func (d *Replay) Write(bufs [][]byte, offset int) (int, error) {
	if d.closed.Load() {
		return 0, os.ErrClosed
	}
	for _, b := range bufs {
		if offset <= len(b) {
			d.stats.txBytes.Add(uint64(len(b) - offset))
		}
	}
	d.stats.txPackets.Add(uint64(len(bufs)))
	return len(bufs), nil
}

// BatchSize implements datapath.Device.
func (d *Replay) BatchSize() int { return d.opts.BatchSize }

// MTU implements datapath.Device.
func (d *Replay) MTU() int { return d.opts.MTU }

// Close implements datapath.Device; it closes the source if it is an
// io.Closer.
func (d *Replay) Close() error {
	if d.closed.Swap(true) {
		return nil
	}
	if c, ok := d.src.(io.Closer); ok {
		return c.Close()
	}
	return nil
}

// Stats implements datapath.StatsReporter. DroppedTooBig counts packets
// over the MTU or the caller's buffer.
func (d *Replay) Stats() datapath.DeviceStats {
	return datapath.DeviceStats{
		RxPackets: d.stats.rxPackets.Load(), RxBytes: d.stats.rxBytes.Load(),
		TxPackets: d.stats.txPackets.Load(), TxBytes: d.stats.txBytes.Load(),
		DroppedTooBig: d.stats.tooBig.Load(),
	}
}

// Skipped returns the number of frames that carried no IP packet.
func (d *Replay) Skipped() uint64 { return d.stats.skipped.Load() }

// CaptureOptions configure NewCapture. The zero value works.
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

// RecorderOptions configure NewRecorder: those of its capture.
type RecorderOptions = CaptureOptions

// Sizes of the pcap format, for MaxBytes.
const (
	fileHeaderLen   = 24
	recordHeaderLen = 16
)

// Capture is a pcap capture of link type RAW being written (bare IPv4 and
// IPv6 packets, nanosecond timestamps), which tcpdump -r and Wireshark
// open directly. Several Recorders may share one Capture (one per TUN
// queue): records are serialised on a mutex and buffered.
type Capture struct {
	opts CaptureOptions

	mu        sync.Mutex // guards everything below but the atomics
	bw        *bufio.Writer
	w         *pcapgo.Writer
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

// NewCapture writes a pcap file header to w. If w is an io.Closer, Close
// closes it.
func NewCapture(w io.Writer, o CaptureOptions) (*Capture, error) {
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
	pw := pcapgo.NewWriterNanos(bw)
	// The header goes out at once: the file is a valid, empty capture
	// from the start.
	if err := pw.WriteFileHeader(uint32(o.Snaplen), layers.LinkTypeRaw); err != nil {
		return nil, fmt.Errorf("pcap capture: %w", err)
	}
	if err := bw.Flush(); err != nil {
		return nil, fmt.Errorf("pcap capture: %w", err)
	}
	c := &Capture{opts: o, bw: bw, w: pw, bytes: fileHeaderLen, lastFlush: o.Now()}
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
	c, err := NewCapture(f, o)
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
	ci := gopacket.CaptureInfo{Timestamp: now, CaptureLength: min(len(p), c.opts.Snaplen), Length: len(p)}
	size := int64(recordHeaderLen + ci.CaptureLength)
	if c.opts.MaxBytes > 0 && c.bytes+size > c.opts.MaxBytes {
		c.stopped.Store(true)
		c.missed.Add(1)
		c.bw.Flush()
		return
	}
	if err := c.w.WritePacket(ci, p[:ci.CaptureLength]); err != nil {
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
	owns  bool // Close closes c too (NewRecorder, CreateRecorder)
}

var (
	_ datapath.Device        = (*Recorder)(nil)
	_ datapath.StatsReporter = (*Recorder)(nil)
)

// NewRecorder starts a capture in w and returns a recorder around inner
// that owns it: Close closes inner, then the capture (and w when it is an
// io.Closer).
func NewRecorder(inner datapath.Device, w io.Writer, o RecorderOptions) (*Recorder, error) {
	c, err := NewCapture(w, o)
	if err != nil {
		return nil, err
	}
	r := c.Wrap(inner)
	r.owns = true
	return r, nil
}

// CreateRecorder records inner's traffic to a new file at path (mode 0600).
func CreateRecorder(inner datapath.Device, path string, o RecorderOptions) (*Recorder, error) {
	c, err := CreateCapture(path, o)
	if err != nil {
		return nil, err
	}
	r := c.Wrap(inner)
	r.owns = true
	return r, nil
}

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

// Capture returns the capture r records in.
func (r *Recorder) Capture() *Capture { return r.c }

// Unwrap returns the device r records, for callers that look for its own
// methods (a TUN's kernel counters).
func (r *Recorder) Unwrap() datapath.Device { return r.inner }

// Flush writes buffered records to the underlying writer.
func (r *Recorder) Flush() error { return r.c.Flush() }

// Recorded returns the number of packets written to the capture.
func (r *Recorder) Recorded() uint64 { return r.c.recorded.Load() }

// Err returns the first error writing the capture, after which recording
// stopped (traffic still passes).
func (r *Recorder) Err() error { return r.c.Err() }

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

// Close implements datapath.Device: it closes the inner device and, when
// r owns its capture, flushes and closes the capture.
func (r *Recorder) Close() error {
	err := r.inner.Close()
	if r.owns {
		if cerr := r.c.Close(); err == nil {
			err = cerr
		}
	} else if ferr := r.c.Flush(); err == nil {
		err = ferr
	}
	return err
}
