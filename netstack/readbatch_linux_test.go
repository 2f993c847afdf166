package netstack

import (
	"runtime"
	"testing"
)

// TestReadBatchOffHeap: the read loop's 64 super-packet buffers (4 MiB)
// are usable end to end and none of them is Go heap.
func TestReadBatchOffHeap(t *testing.T) {
	const n, size = 64, 10 + 65535
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	bufs, unmap := readBatch(n, size)
	runtime.ReadMemStats(&after)
	defer unmap()
	if grew := int64(after.HeapAlloc) - int64(before.HeapAlloc); grew > 64<<10 {
		t.Errorf("the heap grew %d bytes for the batch: want it mapped outside", grew)
	}
	if len(bufs) != n {
		t.Fatalf("%d buffers, want %d", len(bufs), n)
	}
	for i, b := range bufs {
		if len(b) != size || cap(b) != size {
			t.Fatalf("buffer %d: len %d cap %d, want %d", i, len(b), cap(b), size)
		}
		b[0], b[size-1] = byte(i), byte(i+1)
	}
	for i, b := range bufs {
		if b[0] != byte(i) || b[size-1] != byte(i+1) {
			t.Fatalf("buffer %d overlaps another", i)
		}
	}
}
