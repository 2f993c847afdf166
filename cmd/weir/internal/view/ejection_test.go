package view

import (
	"strings"
	"testing"
	"time"

	"weir/cmd/weir/api"
)

// TestWriteTableErrorAndEjection: an http target's error part is in the
// ERROR column, an ejected target's state says until when, and the change
// is named.
func TestWriteTableErrorAndEjection(t *testing.T) {
	st := sample()
	tg := st.Services[0].Targets
	tg[0].Explanation = &api.Explanation{ErrorFraction: 25, ErrorRatio: 100, Responses: 200, Fraction: 25, Winner: "error"}
	tg[1].Ejected, tg[1].EjectedUntil, tg[1].Ejections = true, time.Date(2026, 1, 2, 3, 4, 35, 0, time.UTC), 1
	out := tableString(t, st)
	for _, want := range []string{"ERROR", "25% (10.0% of 200)", "25% error", "ejected until 03:04:35"} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in\n%s", want, out)
		}
	}
	found := false
	for _, l := range Changes(sample(), st) {
		found = found || strings.Contains(l, "t2: ejected after consecutive failures")
	}
	if !found {
		t.Errorf("changes %q do not name the ejection", Changes(sample(), st))
	}
}
