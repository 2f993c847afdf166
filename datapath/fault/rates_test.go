package fault

import (
	"testing"
	"time"

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

func TestSetRatesTurnsDelayOn(t *testing.T) {
	a, b := datapath.NewPipe(datapath.PipeOptions{})
	f := New(a, Options{})
	defer f.Close()
	f.SetRates(Rates{Delay: time.Millisecond}, Rates{})
	f.Write([][]byte{make([]byte, 60)}, 0)
	if got := drain(t, b, 1, time.Second); len(got) != 1 {
		t.Fatalf("delayed packet did not arrive: got %d", len(got))
	}
	if st := f.Stats().Write; st.Delayed != 1 || st.DelayOverflow != 0 {
		t.Errorf("stats = %+v, want 1 delayed, no overflow", st)
	}
}
