// Package pcapdev connects weir's datapath to pcap capture files: Replay
// is a datapath.Device whose input is a capture, and Recorder wraps any
// Device and writes everything read from or written to it into a capture
// (link type RAW: bare IPv4/IPv6 packets), which Wireshark and tcpdump
// open directly.
//
// Flow
//
//	Replay.Read:     pcap record ─► strip link header (Ethernet, Linux SLL) ─► caller's buffer
//	                 end of file ─► 0, os.ErrClosed (or start over, Loops times)
//	Replay.Write:    counted and discarded
//	Recorder.Read:   inner.Read ─► each packet appended to the capture ─► caller
//	Recorder.Write:  each packet appended to the capture ─► inner.Write
//
// The Recorder serialises capture writes on a mutex and buffers them; it
// is a debugging and test tool, not meant to sit on the fast path of a
// loaded appliance.
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

// RecorderOptions configure NewRecorder. The zero value works.
type RecorderOptions struct {
	// Snaplen is the most bytes of each packet recorded; zero means the
	// whole packet (up to 65535).
	Snaplen int
	// Now is the clock for packet timestamps; nil means time.Now.
	Now func() time.Time
}

// Recorder is a datapath.Device that passes everything through to an
// inner device and records it to a pcap capture of link type RAW.
type Recorder struct {
	inner datapath.Device
	opts  RecorderOptions

	mu     sync.Mutex // guards w, bw and err
	bw     *bufio.Writer
	w      *pcapgo.Writer
	err    error // first write error; recording stops after it
	closer io.Closer

	recorded atomic.Uint64
}

var _ datapath.Device = (*Recorder)(nil)

// NewRecorder writes a pcap file header to w and returns a recorder around
// inner. If w is an io.Closer, Close closes it after the inner device.
func NewRecorder(inner datapath.Device, w io.Writer, o RecorderOptions) (*Recorder, error) {
	if o.Snaplen <= 0 || o.Snaplen > 65535 {
		o.Snaplen = 65535
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	bw := bufio.NewWriterSize(w, 64<<10)
	pw := pcapgo.NewWriterNanos(bw)
	if err := pw.WriteFileHeader(uint32(o.Snaplen), layers.LinkTypeRaw); err != nil {
		return nil, fmt.Errorf("pcap recorder: %w", err)
	}
	r := &Recorder{inner: inner, opts: o, bw: bw, w: pw}
	if c, ok := w.(io.Closer); ok {
		r.closer = c
	}
	return r, nil
}

// CreateRecorder records inner's traffic to a new file at path.
func CreateRecorder(inner datapath.Device, path string, o RecorderOptions) (*Recorder, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	r, err := NewRecorder(inner, f, o)
	if err != nil {
		f.Close()
		return nil, err
	}
	return r, nil
}

func (r *Recorder) record(pkts [][]byte) {
	now := r.opts.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil {
		return
	}
	for _, p := range pkts {
		ci := gopacket.CaptureInfo{Timestamp: now, CaptureLength: min(len(p), r.opts.Snaplen), Length: len(p)}
		if err := r.w.WritePacket(ci, p[:ci.CaptureLength]); err != nil {
			r.err = err
			return
		}
	}
	r.recorded.Add(uint64(len(pkts)))
}

// Read implements datapath.Device: it reads from the inner device and
// records what it returns.
func (r *Recorder) Read(bufs [][]byte, sizes []int, offset int) (int, error) {
	n, err := r.inner.Read(bufs, sizes, offset)
	if n > 0 {
		var one [1][]byte
		for i := range n {
			one[0] = bufs[i][offset : offset+sizes[i]]
			r.record(one[:])
		}
	}
	return n, err
}

// Write implements datapath.Device: it records the packets, then writes
// them to the inner device.
func (r *Recorder) Write(bufs [][]byte, offset int) (int, error) {
	var one [1][]byte
	for _, b := range bufs {
		if offset <= len(b) {
			one[0] = b[offset:]
			r.record(one[:])
		}
	}
	return r.inner.Write(bufs, offset)
}

// Flush writes buffered records to the underlying writer.
func (r *Recorder) Flush() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil {
		return r.err
	}
	return r.bw.Flush()
}

// Recorded returns the number of packets written to the capture.
func (r *Recorder) Recorded() uint64 { return r.recorded.Load() }

// Err returns the first error writing the capture, after which recording
// stopped (traffic still passes).
func (r *Recorder) Err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

// BatchSize implements datapath.Device.
func (r *Recorder) BatchSize() int { return r.inner.BatchSize() }

// MTU implements datapath.Device.
func (r *Recorder) MTU() int { return r.inner.MTU() }

// Close implements datapath.Device: it closes the inner device, flushes
// the capture and closes its writer when that is an io.Closer.
func (r *Recorder) Close() error {
	err := r.inner.Close()
	if ferr := r.Flush(); err == nil {
		err = ferr
	}
	if r.closer != nil {
		r.mu.Lock()
		c := r.closer
		r.closer = nil
		r.mu.Unlock()
		if c != nil {
			if cerr := c.Close(); err == nil {
				err = cerr
			}
		}
	}
	return err
}
