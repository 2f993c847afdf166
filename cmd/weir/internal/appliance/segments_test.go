package appliance

import (
	"testing"

	"weir/policy"
)

// TestDirTotalsSignal: /status says which signal found the losses of the
// last interval that measured packets; a quiet interval keeps it.
func TestDirTotalsSignal(t *testing.T) {
	var d DirTotals
	for _, tc := range []struct {
		s    policy.DirSample
		want string
	}{
		{policy.DirSample{}, ""},
		{policy.DirSample{Measured: true, DataSegments: 10}, "sequence"},
		{policy.DirSample{Measured: true, DataSegments: 10, Retransmitted: 1, IPIDPackets: 12}, "sequence+ip_id"},
		{policy.DirSample{Measured: true}, "sequence+ip_id"},
		{policy.DirSample{Measured: true, DataSegments: 5}, "sequence"},
	} {
		addDirTotals(&d, tc.s)
		if d.Signal != tc.want {
			t.Errorf("after %+v: signal %q, want %q", tc.s, d.Signal, tc.want)
		}
	}
	if d.DataSegments != 25 || d.Retransmitted != 1 || d.Source != "measured" {
		t.Errorf("totals %+v", d)
	}
}
