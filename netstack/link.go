package netstack

// Link flow
//
//	ingress: Device.Read(batch) ──► readLoop ──► [pure ACKs a later one of the
//	         batch supersedes skipped: ackbatch.go] ──► version nibble
//	         ──► [synHook set: datapath.Parse; pure SYN? synHook(4-tuple)]
//	         ──► stack.NewPacketBuffer (copy) ──► dispatcher.DeliverNetworkPacket
//	egress:  stack ──► WritePackets ──► copy into a pooled buffer ──► queue (bounded,
//	         drop and count when full) ──► writeLoop ──► Device.Write(batch)
//
// One reader and one writer goroutine per link. The reader hands each batch
// to the stack synchronously, so a flow's packets stay in order; the writer
// collects whatever is queued, up to the device's batch size, into one Write.
// Nothing on either path logs or returns an error per packet: a packet that
// cannot be used is dropped and counted.

import (
	"errors"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/stack"

	"weir/datapath"
)

// LinkStats are the counters of one link: packets between a datapath.Device
// and the stack. All counts are totals since the link was created.
type LinkStats struct {
	RxPackets        uint64 // read from the device and handed to the stack
	RxBytes          uint64 // bytes of RxPackets
	RxCoalesced      uint64 // read pure ACKs not handed over: a later ACK of the same read batch superseded them (ackbatch.go)
	TxPackets        uint64 // handed to Device.Write
	TxBytes          uint64 // bytes of TxPackets
	DroppedMalformed uint64 // read packets with neither version 4 nor 6, or empty
	DroppedDetached  uint64 // read packets that arrived while no stack was attached
	DroppedQueueFull uint64 // egress packets dropped because the write queue was full
	DroppedTooBig    uint64 // egress packets larger than the device MTU
	DroppedClosed    uint64 // egress packets offered after the link closed
	DroppedChecksum  uint64 // read TCP or UDP packets with a bad checksum, on an offload link (the stack does not check there)
	ReadErrors       uint64 // Device.Read calls that failed with other than os.ErrClosed
	WriteErrors      uint64 // Device.Write calls that failed with other than os.ErrClosed
	WriteShort       uint64 // packets a Device.Write did not accept
}

// linkEndpoint bridges a datapath.Device and a gVisor stack. It implements
// stack.LinkEndpoint.
type linkEndpoint struct {
	dev      datapath.Device
	mtu      uint32
	headroom int // bytes before each packet left to the device
	batch    int
	// gsoMax is the device's GSOMaxSize: zero for plain packets, else the
	// largest super-packet, each with a virtio-net header just before it
	// (gso.go).
	gsoMax int

	dispatcher atomic.Pointer[dispatcherBox]
	// synHook, when set, sees the 4-tuple of every inbound pure SYN (SYN
	// without ACK) before the stack does; the TIME_WAIT reopen uses it.
	synHook atomic.Pointer[func(k twKey)]

	queue   chan *[]byte // egress packets, headroom+len bytes each
	bufPool sync.Pool    // *[]byte of headroom+mtu bytes
	bigPool sync.Pool    // *[]byte of headroom+gsoMax bytes, for super-packets
	done    chan struct{}
	closed  atomic.Bool
	once    sync.Once
	wg      sync.WaitGroup

	onClose   atomic.Pointer[func()]
	startOnce sync.Once

	linkAddrMu sync.Mutex
	linkAddr   tcpip.LinkAddress // protected by linkAddrMu

	rxPackets, rxBytes, txPackets, txBytes     atomic.Uint64
	rxCoalesced                                atomic.Uint64
	dropMalformed, dropDetached, dropQueueFull atomic.Uint64
	dropTooBig, dropClosed, dropChecksum       atomic.Uint64
	readErrors, writeErrors, writeShort        atomic.Uint64
}

type dispatcherBox struct{ d stack.NetworkDispatcher }

var _ stack.LinkEndpoint = (*linkEndpoint)(nil)

func newLinkEndpoint(dev datapath.Device, headroom, queueLen int) *linkEndpoint {
	mtu := dev.MTU()
	batch := dev.BatchSize()
	if batch < 1 {
		batch = 1
	}
	if queueLen <= 0 {
		queueLen = DefaultWriteQueueLen
	}
	gsoMax := datapath.GSOMaxSize(dev)
	if gsoMax > 0 {
		gsoMax = max(gsoMax, mtu)
		headroom = max(headroom, datapath.VirtioNetHdrLen)
	}
	e := &linkEndpoint{
		dev:      dev,
		mtu:      uint32(mtu),
		headroom: headroom,
		batch:    batch,
		gsoMax:   gsoMax,
		queue:    make(chan *[]byte, queueLen),
		done:     make(chan struct{}),
	}
	size := headroom + mtu
	e.bufPool.New = func() any {
		b := make([]byte, size)
		return &b
	}
	big := headroom + gsoMax
	e.bigPool.New = func() any {
		b := make([]byte, big)
		return &b
	}
	return e
}

// start launches the reader and writer goroutines.
func (e *linkEndpoint) start() {
	e.startOnce.Do(func() {
		e.wg.Add(2)
		go e.readLoop()
		go e.writeLoop()
	})
}

// readLoop runs in its own goroutine: it reads batches from the device and
// delivers them to the stack until the device is closed.
func (e *linkEndpoint) readLoop() {
	defer e.wg.Done()
	bufs, unmap := readBatch(e.batch, e.headroom+max(int(e.mtu), e.gsoMax))
	defer unmap()
	sizes := make([]int, e.batch)
	// The pure ACKs a later one supersedes (ackbatch.go).
	pkts := make([][]byte, e.batch)
	info := make([]ackInfo, e.batch)
	skip := make([]bool, e.batch)
	for {
		n, err := e.dev.Read(bufs, sizes, e.headroom)
		for i := 0; i < n; i++ {
			pkts[i] = bufs[i][e.headroom : e.headroom+sizes[i]]
		}
		if n > 1 {
			if m := markSuperseded(pkts[:n], info[:n], skip[:n]); m > 0 {
				e.rxCoalesced.Add(uint64(m))
			}
		} else {
			skip[0] = false
		}
		for i := 0; i < n; i++ {
			if !skip[i] {
				e.deliver(pkts[i], e.rxHdr(bufs[i]))
			}
			pkts[i] = nil
		}
		if n > 0 {
			// A device that always has packets waiting (a flood) never
			// blocks this loop in Read: give the other goroutines the P
			// after each batch, so that the connections' own goroutines
			// wait one batch and not a 10 ms preemption slice (weir runs
			// on one P on 2 CPUs).
			runtime.Gosched()
		}
		if err != nil {
			if errors.Is(err, os.ErrClosed) || e.closed.Load() {
				return
			}
			e.readErrors.Add(1)
			if n == 0 {
				// A failing device must not turn this loop into a spin.
				time.Sleep(time.Millisecond)
			}
		}
	}
}

// deliver hands one raw IP packet to the stack. The packet is copied.
// hdr is its virtio-net header, nil on a device without offload.
func (e *linkEndpoint) deliver(pkt []byte, hdr []byte) {
	if len(pkt) == 0 {
		e.dropMalformed.Add(1)
		return
	}
	var proto tcpip.NetworkProtocolNumber
	switch pkt[0] >> 4 {
	case 4:
		proto = header.IPv4ProtocolNumber
	case 6:
		proto = header.IPv6ProtocolNumber
	default:
		e.dropMalformed.Add(1)
		return
	}
	box := e.dispatcher.Load()
	if box == nil {
		e.dropDetached.Add(1)
		return
	}
	if h := e.synHook.Load(); h != nil {
		if k, ok := synKey(pkt); ok {
			(*h)(k)
		}
	}
	e.rxPackets.Add(1)
	e.rxBytes.Add(uint64(len(pkt)))
	if e.gsoMax > 0 && !rxChecksumDone(hdr) && !checksumOK(pkt) {
		e.dropChecksum.Add(1)
		return
	}
	pb := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: buffer.MakeWithData(pkt)})
	box.d.DeliverNetworkPacket(proto, pb)
	pb.DecRef()
}

// writeLoop runs in its own goroutine: it collects queued egress packets into
// batches and writes them to the device until the link is closed.
func (e *linkEndpoint) writeLoop() {
	defer e.wg.Done()
	batch := make([]*[]byte, 0, e.batch)
	bufs := make([][]byte, 0, e.batch)
	for {
		select {
		case b := <-e.queue:
			batch = append(batch, b)
		case <-e.done:
			e.drainQueue()
			return
		}
	fill:
		for len(batch) < e.batch {
			select {
			case b := <-e.queue:
				batch = append(batch, b)
			default:
				break fill
			}
		}
		for _, b := range batch {
			bufs = append(bufs, *b)
		}
		n, err := e.dev.Write(bufs, e.headroom)
		if n < len(bufs) {
			e.writeShort.Add(uint64(len(bufs) - n))
		}
		var bytes uint64
		for _, b := range bufs[:n] {
			bytes += uint64(len(b) - e.headroom)
		}
		e.txPackets.Add(uint64(n))
		e.txBytes.Add(bytes)
		for i, b := range batch {
			e.putBuf(b)
			batch[i] = nil
			bufs[i] = nil
		}
		batch, bufs = batch[:0], bufs[:0]
		if err != nil {
			if errors.Is(err, os.ErrClosed) {
				e.closeOnce()
				e.drainQueue()
				return
			}
			e.writeErrors.Add(1)
		}
	}
}

func (e *linkEndpoint) drainQueue() {
	for {
		select {
		case b := <-e.queue:
			e.dropClosed.Add(1)
			e.putBuf(b)
		default:
			return
		}
	}
}

// WritePackets implements stack.LinkWriter. It copies each packet into a
// pooled buffer and queues it for the writer goroutine; it never blocks. A
// packet that finds the queue full is dropped and counted, and reported as
// written, as a device would: TCP recovers it like any other loss.
func (e *linkEndpoint) WritePackets(pkts stack.PacketBufferList) (int, tcpip.Error) {
	n := 0
	for _, pkt := range pkts.AsSlice() {
		n++
		if e.closed.Load() {
			e.dropClosed.Add(1)
			continue
		}
		size := pkt.Size()
		if size > int(e.mtu) && (pkt.GSOOptions.Type == stack.GSONone || size > e.gsoMax) {
			e.dropTooBig.Add(1)
			continue
		}
		bp := e.getBuf(size)
		b := (*bp)[:e.headroom+size]
		e.txHdr(b[:e.headroom], pkt)
		// AsViewList, unlike AsSlices, does not allocate.
		at := e.headroom
		vl, skip := pkt.AsViewList()
		for v := vl.Front(); v != nil; v = v.Next() {
			s := v.AsSlice()
			if skip >= len(s) {
				skip -= len(s)
				continue
			}
			at += copy(b[at:], s[skip:])
			skip = 0
		}
		*bp = b
		select {
		case e.queue <- bp:
		default:
			e.dropQueueFull.Add(1)
			e.putBuf(bp)
		}
	}
	return n, nil
}

// closeOnce marks the link closed and stops the writer; it does not wait.
func (e *linkEndpoint) closeOnce() {
	e.once.Do(func() {
		e.closed.Store(true)
		close(e.done)
	})
}

// shutdown closes the device, stops both goroutines and waits for them.
func (e *linkEndpoint) shutdown() {
	e.closeOnce()
	_ = e.dev.Close()
	e.wg.Wait()
}

func (e *linkEndpoint) stats() LinkStats {
	return LinkStats{
		RxPackets:        e.rxPackets.Load(),
		RxBytes:          e.rxBytes.Load(),
		RxCoalesced:      e.rxCoalesced.Load(),
		TxPackets:        e.txPackets.Load(),
		TxBytes:          e.txBytes.Load(),
		DroppedMalformed: e.dropMalformed.Load(),
		DroppedDetached:  e.dropDetached.Load(),
		DroppedQueueFull: e.dropQueueFull.Load(),
		DroppedTooBig:    e.dropTooBig.Load(),
		DroppedClosed:    e.dropClosed.Load(),
		DroppedChecksum:  e.dropChecksum.Load(),
		ReadErrors:       e.readErrors.Load(),
		WriteErrors:      e.writeErrors.Load(),
		WriteShort:       e.writeShort.Load(),
	}
}

// MTU implements stack.NetworkLinkEndpoint.
func (e *linkEndpoint) MTU() uint32 { return e.mtu }

// SetMTU implements stack.NetworkLinkEndpoint. The MTU is the device's and
// does not change.
func (e *linkEndpoint) SetMTU(uint32) {}

// MaxHeaderLength implements stack.NetworkLinkEndpoint: raw IP, no link header.
func (*linkEndpoint) MaxHeaderLength() uint16 { return 0 }

// LinkAddress implements stack.NetworkLinkEndpoint.
func (e *linkEndpoint) LinkAddress() tcpip.LinkAddress {
	e.linkAddrMu.Lock()
	defer e.linkAddrMu.Unlock()
	return e.linkAddr
}

// SetLinkAddress implements stack.NetworkLinkEndpoint.
func (e *linkEndpoint) SetLinkAddress(a tcpip.LinkAddress) {
	e.linkAddrMu.Lock()
	e.linkAddr = a
	e.linkAddrMu.Unlock()
}

// Capabilities implements stack.NetworkLinkEndpoint. Without offload,
// none: checksums are computed and verified by the stack, since a TUN peer
// needs them. With offload, RX checksum offload: the kernel hands over its
// own TCP's packets with a partial checksum the stack cannot verify, and
// the link checks the others itself (gso.go).
func (e *linkEndpoint) Capabilities() stack.LinkEndpointCapabilities {
	if e.gsoMax > 0 {
		return stack.CapabilityRXChecksumOffload
	}
	return stack.CapabilityNone
}

// Attach implements stack.NetworkLinkEndpoint.
func (e *linkEndpoint) Attach(d stack.NetworkDispatcher) {
	if d == nil {
		e.dispatcher.Store(nil)
		return
	}
	e.dispatcher.Store(&dispatcherBox{d})
	e.start()
}

// IsAttached implements stack.NetworkLinkEndpoint.
func (e *linkEndpoint) IsAttached() bool { return e.dispatcher.Load() != nil }

// Wait implements stack.NetworkLinkEndpoint.
func (e *linkEndpoint) Wait() { e.wg.Wait() }

// ARPHardwareType implements stack.NetworkLinkEndpoint.
func (*linkEndpoint) ARPHardwareType() header.ARPHardwareType { return header.ARPHardwareNone }

// AddHeader implements stack.NetworkLinkEndpoint: no link header.
func (*linkEndpoint) AddHeader(*stack.PacketBuffer) {}

// ParseHeader implements stack.NetworkLinkEndpoint: no link header.
func (*linkEndpoint) ParseHeader(*stack.PacketBuffer) bool { return true }

// Close implements stack.NetworkLinkEndpoint; the stack calls it when the NIC
// is removed, holding its own locks. It closes the device and stops the
// writer but does not wait for the reader, which may be inside the stack
// waiting for those locks; Wait does.
func (e *linkEndpoint) Close() {
	if f := e.onClose.Load(); f != nil {
		(*f)()
	}
	e.closeOnce()
	_ = e.dev.Close()
}

// SetOnCloseAction implements stack.NetworkLinkEndpoint.
func (e *linkEndpoint) SetOnCloseAction(f func()) {
	if f == nil {
		e.onClose.Store(nil)
		return
	}
	e.onClose.Store(&f)
}

// synKey inspects a raw inbound IP packet with the datapath's checked
// parser and, if it is a pure SYN (TCP, SYN set, ACK clear, not a later
// fragment), returns its 4-tuple as the receiving side sees it: local is
// the destination. Anything Parse rejects (an IPv4 IHL below 5, a truncated
// header, an over-long IPv6 extension chain) is no SYN; IPv6 extension
// headers are walked to the TCP header. It does not allocate.
func synKey(pkt []byte) (twKey, bool) {
	var p datapath.Packet
	if datapath.Parse(pkt, &p) != datapath.DropNone || p.Proto != datapath.ProtoTCP || p.NonFirstFragment {
		return twKey{}, false
	}
	if p.TCPFlags&(datapath.TCPSyn|datapath.TCPAck) != datapath.TCPSyn {
		return twKey{}, false
	}
	return twKey{local: p.DstAddrPort(), remote: p.SrcAddrPort()}, true
}
