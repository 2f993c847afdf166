// Package fault wraps a datapath.Device and injects network faults into its
// traffic: drops, duplicates, reordering and delay, each at a configured
// rate per direction, drawn from a seeded random source so a test run can
// be repeated. It is how weir's tests get real TCP loss and retransmission
// on hosts without netem.
//
// Flow
//
//	Write(bufs) ─► per packet: drop? ─► duplicate? ─► delayed or reordered?
//	               ─► now: inner.Write ─┐  later: delay queue ─► delayLoop ─► inner.Write
//	pumpLoop: inner.Read ─► the same decisions ─► now: queue toward Read
//	                                          └► later: delay queue ─► delayLoop ─┘
//	Read(bufs) ◄── queue toward Read (a datapath memory pair)
//
// A reordered packet is held back by ReorderDelay, so the packets behind it
// overtake it. Delayed packets wait in a bounded queue of preallocated
// buffers served by one goroutine; when it is full a packet that should
// wait is dropped and counted (DelayOverflow), so the caller is never
// blocked. Close stops both goroutines.
//
// The random source of each direction is guarded by a mutex, since Write
// may be called from many goroutines: this is a test transport, not a hot
// path.
package fault

import (
	"errors"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"weir/datapath"
)

// Rates are the faults of one direction. Probabilities are in [0, 1]; zero
// turns a fault off, so the zero Rates pass everything unchanged.
type Rates struct {
	Drop      float64 // probability that a packet is dropped
	Duplicate float64 // probability that a packet is sent twice
	Reorder   float64 // probability that a packet is held back by ReorderDelay
	// Delay is added to every packet (a fixed latency, which keeps order);
	// Jitter adds a uniform random extra in [0, Jitter), which may reorder.
	Delay, Jitter time.Duration
}

func (r Rates) delays() bool { return r.Delay > 0 || r.Jitter > 0 || r.Reorder > 0 }

// Options configure New. The zero value passes traffic unchanged.
type Options struct {
	// Seed seeds the random sources; runs with one seed and one packet
	// sequence make the same decisions.
	Seed uint64
	// Write applies to packets written to the wrapper (toward the inner
	// device); Read to packets read from the inner device.
	Write, Read Rates
	// ReorderDelay is how long a reordered packet is held; zero means 1 ms.
	ReorderDelay time.Duration
	// MaxDelayed bounds the packets waiting in the delay queue, both
	// directions together; zero means 4096.
	MaxDelayed int
	// ReadQueue is the number of packets buffered toward Read; zero means
	// 1024. A full queue drops (counted by the queue's device stats).
	ReadQueue int
}

// DirStats count what the wrapper did to one direction.
type DirStats struct {
	Packets       uint64 // packets that entered the direction
	Dropped       uint64 // dropped on purpose
	Duplicated    uint64 // extra copies sent
	Reordered     uint64 // held back by ReorderDelay
	Delayed       uint64 // delayed by Delay/Jitter
	DelayOverflow uint64 // dropped because the delay queue was full
	// QueueFull counts read-side packets dropped because the queue toward
	// Read (ReadQueue) was full; always zero for writes.
	QueueFull uint64
}

// Stats are the wrapper's counters per direction.
type Stats struct {
	Write, Read DirStats
}

// Device is a datapath.Device with faults injected; see the package doc.
type Device struct {
	inner   datapath.Device
	opts    Options
	readIn  *datapath.MemDevice // pumpLoop and delayLoop write here
	readOut *datapath.MemDevice // Read reads here
	dirs    [2]direction        // 0: write, 1: read

	mu        sync.Mutex // guards delayed, free, delayBufs, closed
	delayBufs bool       // the free list was allocated
	wake      chan struct{}
	delayed   delayHeap
	free      [][]byte
	seq       uint64
	closed    bool

	done sync.WaitGroup
}

type direction struct {
	rates  Rates
	faulty atomic.Bool // rates != Rates{}: Write's fast path checks it
	mu     sync.Mutex  // guards rng
	rng    *rand.Rand
	stats  struct {
		packets, dropped, duplicated, reordered, delayed, overflow atomic.Uint64
	}
}

var _ datapath.Device = (*Device)(nil)

const (
	dirWrite = 0
	dirRead  = 1
)

// New wraps inner and starts the wrapper's two goroutines (the read pump
// and the delay loop); Close stops them.
func New(inner datapath.Device, o Options) *Device {
	if o.ReorderDelay <= 0 {
		o.ReorderDelay = time.Millisecond
	}
	if o.MaxDelayed <= 0 {
		o.MaxDelayed = 4096
	}
	if o.ReadQueue <= 0 {
		o.ReadQueue = 1024
	}
	d := &Device{inner: inner, opts: o, wake: make(chan struct{}, 1)}
	d.readIn, d.readOut = datapath.NewPipe(datapath.PipeOptions{MTU: inner.MTU(), QueueLen: o.ReadQueue, BatchSize: inner.BatchSize()})
	d.dirs[dirWrite].rates = o.Write
	d.dirs[dirWrite].faulty.Store(o.Write != (Rates{}))
	d.dirs[dirWrite].rng = rand.New(rand.NewPCG(o.Seed, 0x9e3779b97f4a7c15))
	d.dirs[dirRead].rates = o.Read
	d.dirs[dirRead].faulty.Store(o.Read != (Rates{}))
	d.dirs[dirRead].rng = rand.New(rand.NewPCG(o.Seed, 0xc2b2ae3d27d4eb4f))
	if o.Write.delays() || o.Read.delays() {
		d.allocDelayBuffers()
	}
	d.done.Add(2)
	go d.pumpLoop()
	go d.delayLoop()
	return d
}

// allocDelayBuffers allocates the delay queue's MaxDelayed buffers once,
// when a direction first delays (at New or SetRates).
func (d *Device) allocDelayBuffers() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.delayBufs {
		return
	}
	d.delayBufs = true
	mtu := d.inner.MTU()
	backing := make([]byte, d.opts.MaxDelayed*mtu)
	d.free = make([][]byte, d.opts.MaxDelayed)
	for i := range d.free {
		d.free[i] = backing[i*mtu : i*mtu : (i+1)*mtu]
	}
}

// decision is what happens to one packet.
type decision struct {
	drop  bool
	dup   bool
	delay time.Duration // 0: now
	kind  int           // for counting: 0 none, 1 reordered, 2 delayed
}

// decide draws one packet's fate; dr.mu is held.
func (d *Device) decide(dir int) decision {
	dr := &d.dirs[dir]
	r := dr.rates
	var dec decision
	if r == (Rates{}) {
		return dec
	}
	dec.drop = r.Drop > 0 && dr.rng.Float64() < r.Drop
	if !dec.drop {
		dec.dup = r.Duplicate > 0 && dr.rng.Float64() < r.Duplicate
		dec.delay = r.Delay
		if r.Jitter > 0 {
			dec.delay += time.Duration(dr.rng.Int64N(int64(r.Jitter)))
		}
		if dec.delay > 0 {
			dec.kind = 2
		}
		if r.Reorder > 0 && dr.rng.Float64() < r.Reorder {
			dec.delay += d.opts.ReorderDelay
			dec.kind = 1
		}
	}
	switch {
	case dec.drop:
		dr.stats.dropped.Add(1)
	case dec.kind == 1:
		dr.stats.reordered.Add(1)
	case dec.kind == 2:
		dr.stats.delayed.Add(1)
	}
	if dec.dup {
		dr.stats.duplicated.Add(1)
	}
	return dec
}

// batcher holds one batch's packets (in) and those that go on at once
// (out); Write takes one from a pool so that it does not allocate.
type batcher struct {
	in, out [][]byte
}

var batchers = sync.Pool{New: func() any { return new(batcher) }}

// process applies dir's faults to pkts (each already sliced past the
// offset): what goes on now is appended to b.out, what waits is queued.
func (d *Device) process(dir int, pkts [][]byte, b *batcher) {
	dr := &d.dirs[dir]
	dr.stats.packets.Add(uint64(len(pkts)))
	dr.mu.Lock()
	defer dr.mu.Unlock()
	for _, p := range pkts {
		dec := d.decide(dir)
		if dec.drop {
			continue
		}
		n := 1
		if dec.dup {
			n = 2
		}
		for range n {
			if dec.delay > 0 {
				d.enqueue(dir, p, dec.delay)
			} else {
				b.out = append(b.out, p)
			}
		}
	}
}

// enqueue copies p into the delay queue, due after delay; a full queue
// drops and counts it.
func (d *Device) enqueue(dir int, p []byte, delay time.Duration) {
	d.mu.Lock()
	if d.closed || len(d.free) == 0 || len(p) > cap(d.free[len(d.free)-1]) {
		d.mu.Unlock()
		d.dirs[dir].stats.overflow.Add(1)
		return
	}
	buf := d.free[len(d.free)-1]
	d.free = d.free[:len(d.free)-1]
	d.seq++
	d.delayed.push(delayedPacket{due: time.Now().Add(delay), seq: d.seq, dir: dir, buf: append(buf[:0], p...)})
	d.mu.Unlock()
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

// Write implements datapath.Device: it applies the write faults and writes
// what goes on now to the inner device. Dropped and delayed packets count
// as written.
func (d *Device) Write(bufs [][]byte, offset int) (int, error) {
	if d.isClosed() {
		return 0, os.ErrClosed
	}
	if !d.dirs[dirWrite].faulty.Load() {
		d.dirs[dirWrite].stats.packets.Add(uint64(len(bufs)))
		return d.inner.Write(bufs, offset)
	}
	bt := batchers.Get().(*batcher)
	defer batchers.Put(bt)
	bt.in, bt.out = bt.in[:0], bt.out[:0]
	for _, b := range bufs {
		if offset <= len(b) {
			bt.in = append(bt.in, b[offset:])
		}
	}
	d.process(dirWrite, bt.in, bt)
	if len(bt.out) > 0 {
		_, err := d.inner.Write(bt.out, 0)
		clear(bt.in)
		clear(bt.out)
		if err != nil {
			return 0, err
		}
	}
	return len(bufs), nil
}

// Read implements datapath.Device: it returns packets read from the inner
// device after the read faults.
func (d *Device) Read(bufs [][]byte, sizes []int, offset int) (int, error) {
	return d.readOut.Read(bufs, sizes, offset)
}

// pumpLoop reads the inner device, applies the read faults and queues
// the packets toward Read. It runs in its own goroutine until the inner
// device fails or closes.
func (d *Device) pumpLoop() {
	defer d.done.Done()
	n := d.inner.BatchSize()
	mtu := d.inner.MTU()
	bufs := make([][]byte, n)
	for i := range bufs {
		bufs[i] = make([]byte, mtu)
	}
	sizes := make([]int, n)
	pkts := make([][]byte, 0, n)
	bt := batcher{out: make([][]byte, 0, 2*n)}
	for {
		k, err := d.inner.Read(bufs, sizes, 0)
		pkts = pkts[:0]
		for i := range k {
			pkts = append(pkts, bufs[i][:sizes[i]])
		}
		bt.out = bt.out[:0]
		d.process(dirRead, pkts, &bt)
		if len(bt.out) > 0 {
			d.readIn.Write(bt.out, 0)
		}
		if err != nil && (k == 0 || errors.Is(err, os.ErrClosed)) {
			d.readIn.Close()
			return
		}
	}
}

// delayLoop releases delayed packets when they are due. It runs in its own
// goroutine until Close.
func (d *Device) delayLoop() {
	defer d.done.Done()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var out [1][]byte
	for {
		d.mu.Lock()
		if d.closed {
			d.mu.Unlock()
			return
		}
		wait := time.Hour
		if len(d.delayed) > 0 {
			wait = time.Until(d.delayed[0].due)
		}
		if wait <= 0 {
			p := d.delayed.pop()
			d.mu.Unlock()
			out[0] = p.buf
			if p.dir == dirWrite {
				d.inner.Write(out[:], 0)
			} else {
				d.readIn.Write(out[:], 0)
			}
			d.mu.Lock()
			d.free = append(d.free, p.buf)
			d.mu.Unlock()
			continue
		}
		d.mu.Unlock()
		timer.Reset(wait)
		select {
		case <-timer.C:
		case <-d.wake:
			timer.Stop() // Go ≥ 1.23: no stale tick is delivered after Stop
		}
	}
}

func (d *Device) isClosed() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.closed
}

// BatchSize implements datapath.Device.
func (d *Device) BatchSize() int { return d.inner.BatchSize() }

// MTU implements datapath.Device.
func (d *Device) MTU() int { return d.inner.MTU() }

// Close implements datapath.Device: it closes the inner device, discards
// delayed packets and waits for the wrapper's goroutines to stop.
func (d *Device) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	d.mu.Unlock()
	select {
	case d.wake <- struct{}{}:
	default:
	}
	err := d.inner.Close()
	d.readOut.Close()
	d.done.Wait()
	return err
}

// Stats returns what the wrapper did so far.
func (d *Device) Stats() Stats {
	get := func(dr *direction) DirStats {
		s := &dr.stats
		return DirStats{
			Packets: s.packets.Load(), Dropped: s.dropped.Load(), Duplicated: s.duplicated.Load(),
			Reordered: s.reordered.Load(), Delayed: s.delayed.Load(), DelayOverflow: s.overflow.Load(),
		}
	}
	st := Stats{Write: get(&d.dirs[dirWrite]), Read: get(&d.dirs[dirRead])}
	st.Read.QueueFull = d.readIn.Stats().DroppedFull
	return st
}

type delayedPacket struct {
	due time.Time
	seq uint64 // FIFO among equal due times
	dir int
	buf []byte
}

// delayHeap is a min-heap of delayed packets by due time, then sequence.
type delayHeap []delayedPacket

func (h delayHeap) less(i, j int) bool {
	if h[i].due.Equal(h[j].due) {
		return h[i].seq < h[j].seq
	}
	return h[i].due.Before(h[j].due)
}

func (h *delayHeap) push(p delayedPacket) {
	*h = append(*h, p)
	a := *h
	for i := len(a) - 1; i > 0; {
		up := (i - 1) / 2
		if !a.less(i, up) {
			break
		}
		a[i], a[up] = a[up], a[i]
		i = up
	}
}

func (h *delayHeap) pop() delayedPacket {
	a := *h
	p := a[0]
	last := len(a) - 1
	a[0] = a[last]
	a[last] = delayedPacket{}
	a = a[:last]
	for i := 0; ; {
		l, r, m := 2*i+1, 2*i+2, i
		if l < len(a) && a.less(l, m) {
			m = l
		}
		if r < len(a) && a.less(r, m) {
			m = r
		}
		if m == i {
			break
		}
		a[i], a[m] = a[m], a[i]
		i = m
	}
	*h = a
	return p
}
