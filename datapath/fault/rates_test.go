package fault

import (
	"testing"

	"weir/datapath"
)

func TestSetRatesTurnsLossOnAndOff(t *testing.T) {
	a, b := datapath.NewPipe(datapath.PipeOptions{QueueLen: 4096})
	defer b.Close()
	f := New(a, Options{Seed: 7})
	defer f.Close()
	pkt := [][]byte{make([]byte, 60)}
	send := func(n int) {
		for range n {
			f.Write(pkt, 0)
		}
	}
	send(100)
	if got := f.Stats().Write.Dropped; got != 0 {
		t.Fatalf("dropped %d with no faults", got)
	}
	f.SetRates(Rates{Drop: 1}, Rates{})
	if w, _ := f.Rates(); w.Drop != 1 {
		t.Fatalf("Rates() = %+v", w)
	}
	send(100)
	if got := f.Stats().Write.Dropped; got != 100 {
		t.Fatalf("dropped %d of 100 at rate 1", got)
	}
	f.SetRates(Rates{}, Rates{})
	send(100)
	if got := f.Stats().Write.Dropped; got != 100 {
		t.Fatalf("dropped %d after turning loss off, want still 100", got)
	}
}
