package datapath

// Memory pair flow
//
//	a.Write(bufs) ──► queue a→b (ring of preallocated MTU-sized slots) ──► b.Read(bufs)
//	a.Read(bufs)  ◄── queue b→a                                        ◄── b.Write(bufs)
//
// Write takes the queue's lock once per batch, copies each packet into a free
// slot and signals a waiting reader; a packet that finds the queue full is
// dropped and counted (DroppedFull), one larger than the MTU is dropped and
// counted (DroppedTooBig). Read takes the lock once per batch, waits while
// the queue is empty, copies up to len(bufs) packets out into the caller's
// buffers and frees their slots. No packet buffer is allocated after NewPipe:
// the slots are allocated once per direction.

import (
	"os"
	"sync"
	"sync/atomic"
)

// PipeOptions configure NewPipe. The zero value works.
type PipeOptions struct {
	// MTU is the largest packet either end carries, in bytes; zero means
	// 1500. Each queue slot is preallocated at this size.
	MTU int
	// QueueLen is the number of packets each direction buffers before Write
	// drops; zero means 1024.
	QueueLen int
	// BatchSize is what BatchSize reports; zero means 64.
	BatchSize int
}

func (o PipeOptions) withDefaults() PipeOptions {
	if o.MTU <= 0 {
		o.MTU = 1500
	}
	if o.QueueLen <= 0 {
		o.QueueLen = 1024
	}
	if o.BatchSize <= 0 {
		o.BatchSize = 64
	}
	return o
}

// MemDevice is one end of an in-process pair made by NewPipe: what one end
// writes the other reads. It needs no privileges and is what tests,
// benchmarks and the demo use in place of a TUN.
//
// Read, Write and Close may be called from any number of goroutines.
// Closing either end closes the pair, as pulling a cable would: pending and
// later Reads and Writes on both ends return os.ErrClosed.
type MemDevice struct {
	in    *pipeQueue // read from here
	out   *pipeQueue // write into here
	mtu   int
	batch int

	// Counters, updated atomically by the goroutines calling Read/Write.
	rxPackets, rxBytes atomic.Uint64
	txPackets, txBytes atomic.Uint64
	droppedFull        atomic.Uint64
	droppedTooBig      atomic.Uint64
}

var (
	_ Device        = (*MemDevice)(nil)
	_ StatsReporter = (*MemDevice)(nil)
)

// pipeQueue is a bounded ring of packet slots, protected by mu. Both ends of
// a pair share a closed flag through their two queues being closed
// together.
type pipeQueue struct {
	mu     sync.Mutex
	cond   sync.Cond // signalled when packets arrive or the pair closes
	slots  [][]byte  // each cap MTU; len is the packet length
	head   int       // index of the oldest packet
	count  int       // packets queued
	closed bool
}

func newPipeQueue(n, mtu int) *pipeQueue {
	q := &pipeQueue{slots: make([][]byte, n)}
	backing := make([]byte, n*mtu)
	for i := range q.slots {
		q.slots[i] = backing[i*mtu : i*mtu : (i+1)*mtu]
	}
	q.cond.L = &q.mu
	return q
}

// NewPipe returns the two connected ends of an in-memory link.
func NewPipe(opts PipeOptions) (a, b *MemDevice) {
	o := opts.withDefaults()
	ab := newPipeQueue(o.QueueLen, o.MTU)
	ba := newPipeQueue(o.QueueLen, o.MTU)
	a = &MemDevice{in: ba, out: ab, mtu: o.MTU, batch: o.BatchSize}
	b = &MemDevice{in: ab, out: ba, mtu: o.MTU, batch: o.BatchSize}
	return a, b
}

// Read implements Device. It blocks until at least one packet is queued or
// the pair is closed. A queued packet longer than len(bufs[i])-offset is
// dropped and counted as DroppedTooBig.
func (d *MemDevice) Read(bufs [][]byte, sizes []int, offset int) (int, error) {
	if len(bufs) == 0 {
		return 0, nil
	}
	q := d.in
	n, bytes, tooBig := 0, 0, 0
	q.mu.Lock()
	for n == 0 {
		for !q.closed && q.count == 0 {
			q.cond.Wait()
		}
		if q.closed {
			q.mu.Unlock()
			if tooBig > 0 {
				d.droppedTooBig.Add(uint64(tooBig))
			}
			return 0, os.ErrClosed
		}
		// Everything dequeued may be too big for the caller's buffers:
		// then wait for more rather than return an empty batch.
		for n < len(bufs) && q.count > 0 {
			s := q.slots[q.head]
			q.head++
			if q.head == len(q.slots) {
				q.head = 0
			}
			q.count--
			dst := bufs[n]
			if offset > len(dst) || len(s) > len(dst)-offset {
				tooBig++
				continue
			}
			sizes[n] = copy(dst[offset:], s)
			bytes += len(s)
			n++
		}
	}
	q.mu.Unlock()
	if tooBig > 0 {
		d.droppedTooBig.Add(uint64(tooBig))
	}
	d.rxPackets.Add(uint64(n))
	d.rxBytes.Add(uint64(bytes))
	return n, nil
}

// Write implements Device. It never blocks on a slow reader: packets that
// find the queue full are dropped and counted as DroppedFull, packets larger
// than the MTU as DroppedTooBig; both are reported as written.
func (d *MemDevice) Write(bufs [][]byte, offset int) (int, error) {
	q := d.out
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return 0, os.ErrClosed
	}
	queued, bytes, full, tooBig := 0, 0, 0, 0
	for _, b := range bufs {
		if offset > len(b) {
			tooBig++
			continue
		}
		p := b[offset:]
		if len(p) > d.mtu {
			tooBig++
			continue
		}
		if q.count == len(q.slots) {
			full++
			continue
		}
		i := q.head + q.count
		if i >= len(q.slots) {
			i -= len(q.slots)
		}
		q.slots[i] = append(q.slots[i][:0], p...)
		q.count++
		queued++
		bytes += len(p)
	}
	if queued > 0 {
		q.cond.Signal()
	}
	q.mu.Unlock()
	if queued > 0 {
		d.txPackets.Add(uint64(queued))
		d.txBytes.Add(uint64(bytes))
	}
	if full > 0 {
		d.droppedFull.Add(uint64(full))
	}
	if tooBig > 0 {
		d.droppedTooBig.Add(uint64(tooBig))
	}
	return len(bufs), nil
}

// Pending returns the number of packets queued toward this end's Read.
// Tests use it to wait for delivery, and a writer to pace itself instead
// of overrunning the queue.
func (d *MemDevice) Pending() int {
	d.in.mu.Lock()
	defer d.in.mu.Unlock()
	return d.in.count
}

// BatchSize implements Device.
func (d *MemDevice) BatchSize() int { return d.batch }

// MTU implements Device.
func (d *MemDevice) MTU() int { return d.mtu }

// Close implements Device. It closes both ends of the pair and wakes every
// pending Read, which returns os.ErrClosed. Packets still queued are
// discarded.
func (d *MemDevice) Close() error {
	for _, q := range [2]*pipeQueue{d.in, d.out} {
		q.mu.Lock()
		q.closed = true
		q.count = 0
		q.cond.Broadcast()
		q.mu.Unlock()
	}
	return nil
}

// Stats implements StatsReporter. Rx counts what this end's Read returned,
// Tx what this end's Write queued toward the peer; the drops are those of
// this end's Write (full queue, too big) and Read (too big for the caller's
// buffer).
func (d *MemDevice) Stats() DeviceStats {
	return DeviceStats{
		RxPackets:     d.rxPackets.Load(),
		RxBytes:       d.rxBytes.Load(),
		TxPackets:     d.txPackets.Load(),
		TxBytes:       d.txBytes.Load(),
		DroppedFull:   d.droppedFull.Load(),
		DroppedTooBig: d.droppedTooBig.Load(),
	}
}
