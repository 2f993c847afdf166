package datapath

// Device is a batch packet transport: a TUN, one end of an in-memory pair, a
// pcap replay, or a wrapper such as the fault injector. Its shape is
// wireguard-go's tun.Device, so that an offload-capable TUN (virtio-net
// headers, GSO/GRO) can replace the water-based one without touching the
// engine: such a device splits or coalesces inside Read and Write and reports
// a larger BatchSize.
//
// Packets are raw IP datagrams (IPv4 or IPv6, told apart by the version
// nibble), with no link-layer header.
type Device interface {
	// Read reads up to len(bufs) packets into bufs[i][offset:], writing each
	// packet's length into sizes[i], and returns how many it read. len(sizes)
	// must be at least len(bufs), and len(bufs) should be at least BatchSize
	// for full batches; each bufs[i][offset:] must hold a whole packet (MTU),
	// a longer packet is truncated and counted as a drop by the device.
	//
	// Read blocks until at least one packet is available or the device is
	// closed. The caller owns bufs before and after the call: the device
	// copies into them and keeps no reference.
	//
	// It returns n > 0 with a nil error on success. After Close, or once the
	// source is exhausted (a pcap replay), it returns 0 and os.ErrClosed,
	// which ends a read loop; any other error is reported with n possibly > 0
	// (those packets are valid) and the caller decides whether to go on.
	Read(bufs [][]byte, sizes []int, offset int) (n int, err error)

	// Write writes the packets bufs[i][offset:] and returns how many it
	// accepted. The packets are copied or sent before Write returns; the
	// caller may reuse bufs at once. Bytes before offset are scratch space
	// the device may use for its own headers (a virtio-net header).
	//
	// A device that cannot take a packet (a full queue) drops and counts it
	// and reports it as written: Write never blocks indefinitely on a slow
	// peer. After Close it returns os.ErrClosed.
	Write(bufs [][]byte, offset int) (n int, err error)

	// BatchSize is the largest number of packets Read returns and the
	// preferred number per Write. It is constant for a device's life.
	BatchSize() int

	// MTU is the largest packet, in bytes, the device carries.
	MTU() int

	// Close releases the device and makes pending and later Reads and
	// Writes return os.ErrClosed. It is safe to call more than once.
	Close() error
}

// DeviceStats are counters a device keeps about itself. All counts are
// totals since the device was created.
type DeviceStats struct {
	RxPackets, RxBytes uint64 // read by the caller
	TxPackets, TxBytes uint64 // accepted by Write
	DroppedFull        uint64 // dropped because a queue was full
	DroppedTooBig      uint64 // dropped because larger than the MTU or buffer
}

// StatsReporter is implemented by devices that count their traffic.
type StatsReporter interface {
	Stats() DeviceStats
}
