package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"weir/internal/netns"
)

// admin reaches weir's admin API (served with --pprof) inside the router
// namespace.
type admin struct {
	ns   *netns.NS
	addr string // host:port, from weir's ready file
}

// get fetches path from the admin API within timeout.
func (a *admin) get(ctx context.Context, path string, timeout time.Duration) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		return a.ns.Dial(ctx, network, addr)
	}}}
	defer c.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+a.addr+path, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("%s: %s", path, resp.Status)
	}
	return b, err
}

// goroutines is weir's goroutine count.
func (a *admin) goroutines(ctx context.Context) (int, error) {
	b, err := a.get(ctx, "/debug/pprof/goroutine?debug=1", 10*time.Second)
	if err != nil {
		return 0, err
	}
	return parseGoroutines(b)
}

// parseGoroutines reads "goroutine profile: total N" off a debug=1
// goroutine profile.
func parseGoroutines(b []byte) (int, error) {
	line, _, _ := bytes.Cut(b, []byte("\n"))
	rest, ok := bytes.CutPrefix(line, []byte("goroutine profile: total "))
	if !ok {
		return 0, fmt.Errorf("goroutine profile: %q", line)
	}
	return strconv.Atoi(string(bytes.TrimSpace(rest)))
}

// goMem is what weir's Go runtime holds, after a forced GC.
type goMem struct {
	HeapInuse  int64 `json:"heap_inuse_bytes"`
	StackInuse int64 `json:"stack_inuse_bytes"`
}

// memory reads weir's heap profile with gc=1 (a GC first) for its MemStats.
func (a *admin) memory(ctx context.Context) (goMem, error) {
	b, err := a.get(ctx, "/debug/pprof/heap?debug=1&gc=1", 30*time.Second)
	if err != nil {
		return goMem{}, err
	}
	return parseMemStats(b)
}

// parseMemStats reads "# HeapInuse = N" and "# Stack = inuse / sys" off a
// debug=1 heap profile.
func parseMemStats(b []byte) (goMem, error) {
	var m goMem
	var heap, stack bool
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if v, ok := strings.CutPrefix(l, "# HeapInuse = "); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			m.HeapInuse, heap = n, err == nil
		}
		if v, ok := strings.CutPrefix(l, "# Stack = "); ok {
			in, _, _ := strings.Cut(v, "/")
			n, err := strconv.ParseInt(strings.TrimSpace(in), 10, 64)
			m.StackInuse, stack = n, err == nil
		}
	}
	if !heap || !stack {
		return m, fmt.Errorf("heap profile: no HeapInuse or Stack line")
	}
	return m, nil
}

// profileResult is one CPU profile of weir during a run.
type profileResult struct {
	Test string `json:"test"`
	Rep  int    `json:"rep"`
	File string `json:"file"`
	// Top is `go tool pprof -top` of it (empty without a Go toolchain).
	Top string `json:"top,omitempty"`
	Err string `json:"error,omitempty"`
}

// cpuProfile takes a CPU profile of secs seconds into file, in the
// background; the channel yields the result.
func (a *admin) cpuProfile(ctx context.Context, secs int, file string) <-chan profileResult {
	ch := make(chan profileResult, 1)
	go func() {
		r := profileResult{File: file}
		b, err := a.get(ctx, fmt.Sprintf("/debug/pprof/profile?seconds=%d", secs), time.Duration(secs)*time.Second+30*time.Second)
		if err == nil {
			err = os.WriteFile(file, b, 0o644)
		}
		if err != nil {
			r.Err = err.Error()
			ch <- r
			return
		}
		r.Top = pprofTop(ctx, file)
		ch <- r
	}()
	return ch
}

// pprofTop is `go tool pprof -top` of a profile file, or "" without a Go
// toolchain.
func pprofTop(ctx context.Context, file string, flags ...string) string {
	if _, err := exec.LookPath("go"); err != nil {
		return ""
	}
	args := append([]string{"tool", "pprof", "-top", "-nodecount=30"}, flags...)
	cmd := exec.CommandContext(ctx, "go", append(args, file)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return fmt.Sprintf("go tool pprof: %v: %s\n", err, strings.TrimSpace(stderr.String()))
	}
	return string(out)
}
