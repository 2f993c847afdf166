//go:build linux

package netstack

import (
	"os"

	"golang.org/x/sys/unix"
)

// readBatch returns n buffers of size bytes for the read loop, in one
// anonymous mapping outside the Go heap (readbatch.go), each slot starting
// on a page of its own, and the function that unmaps them once the loop
// has ended. If the mapping fails it falls back to the heap.
func readBatch(n, size int) ([][]byte, func()) {
	page := os.Getpagesize()
	stride := (size + page - 1) / page * page
	mem, err := unix.Mmap(-1, 0, n*stride, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return heapBatch(n, size), func() {}
	}
	bufs := make([][]byte, n)
	for i := range bufs {
		bufs[i] = mem[i*stride : i*stride+size : i*stride+size]
	}
	return bufs, func() { unix.Munmap(mem) }
}
