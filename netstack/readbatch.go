package netstack

// The read loop's batch buffers
//
// A link reads up to a batch of packets per wake-up, each into a buffer
// that can hold a super-packet (headroom + 64 KiB on an offloaded TUN): 64
// slots make 4 MiB per link, of which a connection load touches the first
// page of a few slots and a bulk transfer a few slots whole. On the Go
// heap those 4 MiB per link (the unused back arm's included) counted as
// live data, and the collector let the heap grow half as much again in
// garbage before each cycle (GOGC=50): resident memory for nothing. So on
// Linux the batch is mapped outside the heap (anonymous, private): the
// kernel gives a page only when a read first writes it, and the collector
// neither counts nor scans it. The mapping goes when the read loop ends;
// nothing keeps a packet's bytes past deliver (the stack copies each
// packet into its own buffer).

// heapBatch is the portable batch: n buffers of size bytes on the heap.
func heapBatch(n, size int) [][]byte {
	bufs := make([][]byte, n)
	for i := range bufs {
		bufs[i] = make([]byte, size)
	}
	return bufs
}
