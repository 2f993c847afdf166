package status

import (
	"sync"
	"time"

	"weir/cmd/weir/api"
)

// Reloads is the configuration's record for /status: the generation in
// force and when it was loaded, the last configuration rejected since, and
// the counts of reloads and rejections. Safe for concurrent use; the zero
// value is before the first load.
type Reloads struct {
	mu                sync.Mutex
	gen               int64
	loadedAt          time.Time
	rejected          *api.ReloadError // since the last load
	reloads, failures uint64
}

// Loaded records a configuration put in force at at and returns its
// generation: 1 for the first, which is no reload.
func (r *Reloads) Loaded(at time.Time) int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.gen++
	if r.gen > 1 {
		r.reloads++
	}
	r.loadedAt, r.rejected = at, nil
	return r.gen
}

// Failed records a configuration rejected at at; the one in force stays.
func (r *Reloads) Failed(at time.Time, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.rejected = &api.ReloadError{At: at, Err: err.Error()}
	r.failures++
}

// Fill sets the record's fields of st.
func (r *Reloads) Fill(st *api.Status) {
	r.mu.Lock()
	defer r.mu.Unlock()
	st.Generation, st.LoadedAt, st.ReloadError = r.gen, r.loadedAt, r.rejected
	st.Reloads, st.ReloadFailures = r.reloads, r.failures
}
