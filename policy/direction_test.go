package policy

import "testing"

func TestSelectDirection(t *testing.T) {
	from := DirSample{DataSegments: 1000, Retransmitted: 50, Timeouts: 1, Measured: true}
	to := DirSample{DataSegments: 200, Retransmitted: 2, Timeouts: 2, Measured: true}
	unmeasured := DirSample{DataSegments: 900, Estimate: true}
	tests := []struct {
		name     string
		dir      Direction
		from, to DirSample
		want     Direction
		wantSegs uint64
	}{
		{"default reads the target's", FromTarget, from, to, FromTarget, 1000},
		{"toTarget reads weir's", ToTarget, from, to, ToTarget, 200},
		{"both: from is larger", DirectionBoth, from, to, FromTarget, 1000},
		{"both: to is larger", DirectionBoth, to, from, ToTarget, 1000},
		{"both: loss tie, timeout decides", DirectionBoth, DirSample{DataSegments: 100, Retransmitted: 1, Measured: true},
			DirSample{DataSegments: 200, Retransmitted: 2, Timeouts: 1, Measured: true}, ToTarget, 200},
		{"unmeasured from gives way", FromTarget, unmeasured, to, ToTarget, 200},
		{"both: unmeasured never larger", DirectionBoth, unmeasured, to, ToTarget, 200},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := TargetSample{FromTarget: tt.from, ToTarget: tt.to}
			got := SelectDirection(&Monitor{Direction: tt.dir}, &s)
			if got != tt.want || s.SegmentsSent != tt.wantSegs {
				t.Errorf("got %v with %d segments, want %v with %d", got, s.SegmentsSent, tt.want, tt.wantSegs)
			}
			ds := tt.from
			if got == ToTarget {
				ds = tt.to
			}
			if s.Retransmits != ds.Retransmitted || s.Timeouts != ds.Timeouts {
				t.Errorf("retransmits %d timeouts %d, want %d %d", s.Retransmits, s.Timeouts, ds.Retransmitted, ds.Timeouts)
			}
		})
	}
}

func TestParseDirectionScope(t *testing.T) {
	for _, d := range []Direction{FromTarget, ToTarget, DirectionBoth} {
		if got, err := ParseDirection(d.String()); err != nil || got != d {
			t.Errorf("ParseDirection(%q) = %v, %v", d, got, err)
		}
	}
	for _, s := range []Scope{ScopePolicy, ScopeAll} {
		if got, err := ParseScope(s.String()); err != nil || got != s {
			t.Errorf("ParseScope(%q) = %v, %v", s, got, err)
		}
	}
	if _, err := ParseDirection("up"); err == nil {
		t.Error("ParseDirection(up): no error")
	}
}
