package proxy

import "testing"

// TestDirCounters: an aggregate adds the counts and keeps the weakest
// source (none only if all had none); a delta is 0 where the counters went
// back (a new datapath flow restarts them).
func TestDirCounters(t *testing.T) {
	var agg DirCounters
	agg.Add(DirCounters{})
	if agg.Source != DirNone {
		t.Errorf("source %v after an unmeasured leg, want none", agg.Source)
	}
	agg.Add(DirCounters{DataSegments: 10, Retransmitted: 1, Timeouts: 1, OutOfOrder: 2, IPIDPackets: 12, Source: DirPassive})
	agg.Add(DirCounters{DataSegments: 5, Source: DirEstimate})
	agg.Add(DirCounters{DataSegments: 1, Source: DirKernel})
	if want := (DirCounters{DataSegments: 16, Retransmitted: 1, Timeouts: 1, OutOfOrder: 2, IPIDPackets: 12, Source: DirEstimate}); agg != want {
		t.Errorf("aggregate %+v, want %+v", agg, want)
	}
	a := DirCounters{DataSegments: 20, Retransmitted: 3, Timeouts: 2, OutOfOrder: 4, IPIDPackets: 30, Source: DirPassive}
	b := DirCounters{DataSegments: 15, Retransmitted: 1, Timeouts: 2, OutOfOrder: 1, IPIDPackets: 20, Source: DirPassive}
	if got, want := SubDir(a, b), (DirCounters{DataSegments: 5, Retransmitted: 2, OutOfOrder: 3, IPIDPackets: 10, Source: DirPassive}); got != want {
		t.Errorf("SubDir = %+v, want %+v", got, want)
	}
	if got, want := SubDir(b, a), (DirCounters{DataSegments: 15, Retransmitted: 1, Timeouts: 2, OutOfOrder: 1, IPIDPackets: 20, Source: DirPassive}); got != want {
		t.Errorf("SubDir after a restart = %+v, want the new flow's counts %+v", got, want)
	}
	if DirEstimate.String() != "estimate" || DirNone.String() != "none" {
		t.Error("DirSource names")
	}
}
