//go:build !linux

package netstack

// readBatch returns n buffers of size bytes for the read loop, on the heap.
func readBatch(n, size int) ([][]byte, func()) { return heapBatch(n, size), func() {} }
