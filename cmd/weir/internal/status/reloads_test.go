package status

import (
	"errors"
	"testing"
	"time"

	"weir/cmd/weir/api"
)

// TestReloads: the first load is generation 1 and no reload; a rejection is
// shown until the next load, which clears it, and both are counted.
func TestReloads(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var r Reloads
	if g := r.Loaded(t0); g != 1 {
		t.Fatalf("first load: generation %d", g)
	}
	r.Failed(t0.Add(time.Second), errors.New("bad yaml"))
	var st api.Status
	r.Fill(&st)
	if st.Generation != 1 || !st.LoadedAt.Equal(t0) || st.Reloads != 0 || st.ReloadFailures != 1 ||
		st.ReloadError == nil || st.ReloadError.Err != "bad yaml" || !st.ReloadError.At.Equal(t0.Add(time.Second)) {
		t.Errorf("after a rejection: %+v %+v", st, st.ReloadError)
	}
	if g := r.Loaded(t0.Add(2 * time.Second)); g != 2 {
		t.Fatalf("reload: generation %d", g)
	}
	r.Fill(&st)
	if st.Generation != 2 || st.Reloads != 1 || st.ReloadFailures != 1 || st.ReloadError != nil || !st.LoadedAt.Equal(t0.Add(2*time.Second)) {
		t.Errorf("after a reload: %+v", st)
	}
}
