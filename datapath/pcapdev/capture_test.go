package pcapdev

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/gopacket/pcapgo"

	"weir/datapath"
)

// openCapture opens the capture at path with gopacket's reader, which
// knows nothing of the writer: the file is closed when the test ends.
func openCapture(t *testing.T, path string) *pcapgo.Reader {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	r, err := pcapgo.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// readCapture returns every record of the capture at path.
func readCapture(t *testing.T, path string) [][]byte {
	t.Helper()
	r := openCapture(t, path)
	var out [][]byte
	for {
		data, _, err := r.ReadPacketData()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("record %d: %v", len(out), err)
		}
		out = append(out, data)
	}
}

// TestCaptureSharedAndBounded: two queues record into one capture bounded
// by MaxBytes. The file never grows past the bound, holds whole records
// only, and every packet is either recorded or counted missed; traffic
// passes either way.
func TestCaptureSharedAndBounded(t *testing.T) {
	path := filepath.Join(t.TempDir(), "front.pcap")
	pkt := ipPacket(t, false, 1)
	const maxBytes = 1000
	c, err := CreateCapture(path, CaptureOptions{MaxBytes: maxBytes})
	if err != nil {
		t.Fatal(err)
	}
	var recs []*Recorder
	var peers []datapath.Device
	for range 2 {
		a, b := datapath.NewPipe(datapath.PipeOptions{})
		recs = append(recs, c.Wrap(a))
		peers = append(peers, b)
	}
	const perQueue = 20
	for _, r := range recs {
		for range perQueue {
			if n, err := r.Write([][]byte{pkt}, 0); n != 1 || err != nil {
				t.Fatalf("Write = %d, %v", n, err)
			}
		}
	}
	for _, p := range peers {
		got := 0
		bufs, sizes := [][]byte{make([]byte, 1500)}, []int{0}
		for got < perQueue {
			n, err := p.Read(bufs, sizes, 0)
			if err != nil {
				t.Fatal(err)
			}
			got += n
		}
	}
	for _, r := range recs {
		r.Close()
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	st := c.Stats()
	per := int64(recordHeaderLen + len(pkt))
	wantRecorded := uint64((maxBytes - fileHeaderLen) / per)
	if st.Recorded != wantRecorded || st.Recorded+st.Missed != 2*perQueue {
		t.Errorf("stats %+v: want %d recorded, %d missed", st, wantRecorded, 2*perQueue-wantRecorded)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() > maxBytes || fi.Size() != st.Bytes {
		t.Errorf("file is %d bytes, stats say %d, bound %d", fi.Size(), st.Bytes, maxBytes)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("capture mode %v, want 0600: it holds the traffic's payload", fi.Mode().Perm())
	}
	if got := readCapture(t, path); uint64(len(got)) != st.Recorded {
		t.Errorf("file holds %d records, Recorded %d", len(got), st.Recorded)
	}
}

// TestCaptureFlushesWhileRunning: records reach the file within
// FlushEvery, so a capture can be read while weir runs.
func TestCaptureFlushesWhileRunning(t *testing.T) {
	path := filepath.Join(t.TempDir(), "live.pcap")
	clock := time.Unix(1_700_000_000, 0)
	c, err := CreateCapture(path, CaptureOptions{FlushEvery: time.Second, Now: func() time.Time { return clock }})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	a, _ := datapath.NewPipe(datapath.PipeOptions{})
	r := c.Wrap(a)
	r.Write([][]byte{ipPacket(t, false, 1)}, 0)
	if got := readCapture(t, path); len(got) != 0 {
		t.Fatalf("%d records on disk before FlushEvery passed", len(got))
	}
	clock = clock.Add(time.Second)
	r.Write([][]byte{ipPacket(t, true, 2)}, 0)
	if got := readCapture(t, path); len(got) != 2 {
		t.Fatalf("%d records on disk after FlushEvery, want 2", len(got))
	}
}

func TestCaptureRejects(t *testing.T) {
	if _, err := newCapture(io.Discard, CaptureOptions{MaxBytes: 10}); err == nil {
		t.Error("MaxBytes below the file header accepted")
	}
	// An existing world-readable file is narrowed to 0600.
	path := filepath.Join(t.TempDir(), "old.pcap")
	if err := os.WriteFile(path, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := CreateCapture(path, CaptureOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %v after CreateCapture over a 0644 file", fi.Mode().Perm())
	}
}
