package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"
)

// DialFunc opens a connection to addr, e.g. net.Dialer.DialContext or a
// dial through a client gVisor stack.
type DialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

// Load describes a bounded HTTP load: Clients goroutines each open a new
// connection per request (the balancer decides per connection) until
// Requests are done or Duration has passed, whichever comes first.
type Load struct {
	Dial     DialFunc      // nil means a host socket (net.Dialer)
	Addr     string        // VIP:port
	Clients  int           // concurrent clients; 0 means 1
	Requests int           // total requests; 0 means unbounded (Duration bounds it)
	Duration time.Duration // 0 means 30 s, a hard bound in every case
	Timeout  time.Duration // per request; 0 means 5 s
	Path     string        // request path; "" means "/"
	// Upload, when > 0, makes each request a POST carrying this many bytes,
	// so the client → target direction carries bulk data.
	Upload int
}

// Result is what a load saw.
type Result struct {
	Requests   int            // attempted
	OK         int            // 200 answers
	PerTarget  map[string]int // 200 answers by X-Weir-Target
	Refused503 int            // 503 answers (limit pages)
	Reasons    map[string]int // 503 page first lines
	Reset      int            // connection refused or reset before an answer
	Failed     int            // other errors (timeouts)
	Bytes      int64          // response bytes read
	Elapsed    time.Duration
	Errors     []string // up to 10 distinct error texts
}

// Run drives the load and returns what it saw. It stops on ctx, on
// Requests, or on Duration.
func (l Load) Run(ctx context.Context) Result {
	clients := max(l.Clients, 1)
	dur := l.Duration
	if dur <= 0 {
		dur = 30 * time.Second
	}
	timeout := l.Timeout
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	path := l.Path
	if path == "" {
		path = "/"
	}
	deadline := time.Now().Add(dur)
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()

	var (
		mu     sync.Mutex
		res    = Result{PerTarget: map[string]int{}, Reasons: map[string]int{}}
		issued int
		wg     sync.WaitGroup
	)
	next := func() bool {
		mu.Lock()
		defer mu.Unlock()
		// The deadline is checked by the clock too: ctx reports it only once
		// its timer has run, and requests started in between fail at once.
		if ctx.Err() != nil || !time.Now().Before(deadline) || (l.Requests > 0 && issued >= l.Requests) {
			return false
		}
		issued++
		return true
	}
	start := time.Now()
	for range clients {
		wg.Go(func() {
			for next() {
				o := l.one(ctx, timeout, path)
				mu.Lock()
				res.add(o)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	res.Elapsed = time.Since(start)
	return res
}

type outcome struct {
	status int
	target string
	reason string
	bytes  int64
	err    error
}

func (r *Result) add(o outcome) {
	r.Requests++
	r.Bytes += o.bytes
	switch {
	case o.err != nil:
		if isReset(o.err) {
			r.Reset++
		} else {
			r.Failed++
		}
		msg := o.err.Error()
		if len(r.Errors) < 10 && !contains(r.Errors, msg) {
			r.Errors = append(r.Errors, msg)
		}
	case o.status == http.StatusOK:
		r.OK++
		r.PerTarget[o.target]++
	case o.status == http.StatusServiceUnavailable:
		r.Refused503++
		r.Reasons[o.reason]++
	default:
		r.Failed++
	}
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

func isReset(err error) bool {
	s := err.Error()
	return strings.Contains(s, "connection refused") || strings.Contains(s, "connection reset") ||
		errors.Is(err, io.EOF) || strings.Contains(s, "broken pipe")
}

func (l Load) one(ctx context.Context, timeout time.Duration, path string) outcome {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	dial := l.Dial
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	c, err := dial(ctx, "tcp", l.Addr)
	if err != nil {
		return outcome{err: err}
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	if l.Upload > 0 {
		if _, err := fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\nContent-Length: %d\r\n\r\n", path, l.Addr, l.Upload); err != nil {
			return outcome{err: err}
		}
		if _, err := c.Write(uploadBody(l.Upload)); err != nil {
			return outcome{err: err}
		}
	} else if _, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", path, l.Addr); err != nil {
		return outcome{err: err}
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return outcome{err: err}
	}
	defer resp.Body.Close()
	o := outcome{status: resp.StatusCode, target: resp.Header.Get("X-Weir-Target")}
	if resp.StatusCode == http.StatusServiceUnavailable {
		// A refusal page is small: keep it for its reason.
		body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		o.bytes, o.err, o.reason = int64(len(body)), err, ReasonOf(string(body))
		return o
	}
	// Count the rest without keeping it: the load generator must not cost
	// more than what it measures.
	o.bytes, o.err = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<20))
	return o
}

var (
	uploadMu  sync.Mutex
	uploadBuf []byte
)

// uploadBody returns n bytes of request body, shared read-only.
func uploadBody(n int) []byte {
	uploadMu.Lock()
	defer uploadMu.Unlock()
	if len(uploadBuf) < n {
		uploadBuf = make([]byte, n)
		for i := range uploadBuf {
			uploadBuf[i] = 'u'
		}
	}
	return uploadBuf[:n]
}

// ReasonOf extracts the limit named by a weir 503 page: the text of its
// first <p> element, or its first non-empty line.
func ReasonOf(page string) string {
	if i := strings.Index(page, "<p>"); i >= 0 {
		rest := page[i+3:]
		if j := strings.Index(rest, "</p>"); j >= 0 {
			return strings.TrimSpace(rest[:j])
		}
	}
	for _, line := range strings.Split(page, "\n") {
		if s := strings.TrimSpace(line); s != "" {
			return s
		}
	}
	return ""
}

// Share returns each target's share of the OK answers, sorted by name.
func (r Result) Share() []TargetShare {
	var out []TargetShare
	for name, n := range r.PerTarget {
		out = append(out, TargetShare{Name: name, Count: n, Share: float64(n) / float64(max(r.OK, 1))})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// TargetShare is one target's part of a load's answers.
type TargetShare struct {
	Name  string
	Count int
	Share float64
}
