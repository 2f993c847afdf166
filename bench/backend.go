package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Backend is a small HTTP server standing in for a target: it answers every
// request with its name (in the body and the X-Weir-Target header), after an
// optional delay, and counts what it served. It serves on any net.Listener: a
// loopback socket, or a listener on a gVisor stack.
type Backend struct {
	Name string
	// Delay is how long each request takes; 0 answers at once.
	Delay time.Duration
	// Hold, when set, keeps every request waiting (after Delay) until it
	// is closed: a test holds its connections open exactly as long as it
	// needs (until the refusals it expects are counted), where a Delay
	// would guess how fast a loaded machine brings all its clients in.
	Hold <-chan struct{}
	// Body, when > 0, is the size in bytes of the response body (the name is
	// padded), for bulk-transfer loads.
	Body int
	// HealthPath, when set, is a health endpoint: requests for it are
	// answered with the status HealthStatus holds (0: 200), an empty body,
	// and are not counted in Served.
	HealthPath   string
	HealthStatus atomic.Int32
	// ErrorEvery, when > 0, answers every ErrorEvery-th request (health
	// checks not counted) with 500 Internal Server Error instead of its
	// body: 10 fails exactly a tenth. Such requests count in Errored, not
	// Served. It may change while the backend serves.
	ErrorEvery atomic.Int32
	// Group, when set, counts this backend's requests in progress together
	// with the other backends that share it: the peak over a service's
	// targets at once, exact where a sum of per-backend reads is not.
	Group *Gauge

	served  atomic.Int64
	errored atomic.Int64
	seq     atomic.Int64 // requests counted for ErrorEvery
	active  atomic.Int64
	maxSeen atomic.Int64

	mu      sync.Mutex // guards srv and the cached body
	srv     *http.Server
	bodyBuf []byte
	bodyFor string
	bodyLen int
}

// Served is the number of requests answered.
func (b *Backend) Served() int64 { return b.served.Load() }

// Errored is the number of requests answered 500 (ErrorEvery).
func (b *Backend) Errored() int64 { return b.errored.Load() }

// Active is the number of requests in progress.
func (b *Backend) Active() int64 { return b.active.Load() }

// MaxActive is the largest number of requests in progress at once so far.
func (b *Backend) MaxActive() int64 { return b.maxSeen.Load() }

// Gauge is a count of requests in progress and its peak.
type Gauge struct {
	cur, peak atomic.Int64
}

// Add moves the count by d and the peak with it.
func (g *Gauge) Add(d int64) {
	n := g.cur.Add(d)
	for m := g.peak.Load(); n > m && !g.peak.CompareAndSwap(m, n); m = g.peak.Load() {
	}
}

// Peak is the largest count seen so far.
func (g *Gauge) Peak() int64 { return g.peak.Load() }

// Cur is the value now.
func (g *Gauge) Cur() int64 { return g.cur.Load() }

// ServeHTTP answers one request.
func (b *Backend) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := b.active.Add(1)
	defer b.active.Add(-1)
	if b.Group != nil {
		b.Group.Add(1)
		defer b.Group.Add(-1)
	}
	for {
		m := b.maxSeen.Load()
		if n <= m || b.maxSeen.CompareAndSwap(m, n) {
			break
		}
	}
	if b.HealthPath != "" && r.URL.Path == b.HealthPath {
		code := int(b.HealthStatus.Load())
		if code == 0 {
			code = http.StatusOK
		}
		w.WriteHeader(code)
		return
	}
	// Read the whole request body (an upload) before answering.
	if _, err := io.Copy(io.Discard, r.Body); err != nil {
		return
	}
	if b.Delay > 0 {
		t := time.NewTimer(b.Delay)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
			return
		}
	}
	if b.Hold != nil {
		select {
		case <-b.Hold:
		case <-r.Context().Done():
			return
		}
	}
	w.Header().Set("X-Weir-Target", b.Name)
	if n := int64(b.ErrorEvery.Load()); n > 0 && b.seq.Add(1)%n == 0 {
		w.WriteHeader(http.StatusInternalServerError)
		b.errored.Add(1)
		return
	}
	body := b.body()
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.Write(body)
	b.served.Add(1)
}

// body returns the response body: the name, padded to Body bytes. It is
// built once per Name and Body and shared read-only.
func (b *Backend) body() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.bodyFor != b.Name || b.bodyLen != b.Body || b.bodyBuf == nil {
		body := []byte(b.Name + "\n")
		if b.Body > len(body) {
			pad := make([]byte, b.Body)
			copy(pad, body)
			for i := len(body); i < len(pad); i++ {
				pad[i] = 'x'
			}
			body = pad
		}
		b.bodyBuf, b.bodyFor, b.bodyLen = body, b.Name, b.Body
	}
	return b.bodyBuf
}

// Serve serves HTTP on ln until Close; it runs in the caller's goroutine.
func (b *Backend) Serve(ln net.Listener) error {
	b.mu.Lock()
	if b.srv == nil {
		b.srv = &http.Server{Handler: b, ReadHeaderTimeout: 10 * time.Second}
	}
	srv := b.srv
	b.mu.Unlock()
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("backend %s: %w", b.Name, err)
	}
	return nil
}

// Close stops the server and closes its connections.
func (b *Backend) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.srv == nil {
		b.srv = &http.Server{}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	b.srv.Shutdown(ctx)
	return b.srv.Close()
}
