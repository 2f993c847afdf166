package main

// The idle measurement: `weirbench hold` (in the client namespace) opens N
// connections through weir to the rrserver, each carrying one request and
// its response (data has flowed both ways), and then holds them open and
// silent. The harness reads weir's resident set, its Go heap and stacks
// (after a GC) and its goroutines before and while they are held: the
// difference over N is what one idle spliced connection costs. The target
// legs' kernel socket buffers are the kernel's, not in weir's RSS.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// closeNever asks the rrserver to answer and then hold the connection until
// the client closes it, with no deadline.
const closeNever = 'I'

// idleResult is what the idle measurement found.
type idleResult struct {
	Conns  int `json:"conns"` // held at the measurement
	Errors int `json:"errors"`
	// Per held connection: weir's RSS growth, its Go heap and stack growth
	// (in use, after a GC) and its extra goroutines.
	RSSKiBPerConn     float64 `json:"rss_kib_per_conn"`
	GoKiBPerConn      float64 `json:"go_kib_per_conn"`
	HeapKiBPerConn    float64 `json:"heap_kib_per_conn"`
	StackKiBPerConn   float64 `json:"stack_kib_per_conn"`
	GoroutinesPerConn float64 `json:"goroutines_per_conn"`
	RSSBefore         int64   `json:"rss_before_bytes"`
	RSSHeld           int64   `json:"rss_held_bytes"`
	// HeapFile is weir's heap profile while the connections are held,
	// HeapTop its `go tool pprof -top` (in-use space; empty without Go).
	HeapFile string `json:"heap_file,omitempty"`
	HeapTop  string `json:"heap_top,omitempty"`
}

// holdResult is `weirbench hold`'s line once its connections are open.
type holdResult struct {
	Held   int      `json:"held"`
	Errors int      `json:"errors"`
	Texts  []string `json:"error_texts,omitempty"`
}

// holdConns opens n connections to addr with c workers, each one request
// and response ('I': the server then waits for the client's close); it
// returns the open ones.
func holdConns(ctx context.Context, addr string, n, c int) ([]net.Conn, holdResult) {
	req := make([]byte, reqSize)
	for i := range req {
		req[i] = 'q'
	}
	req[0] = closeNever
	var (
		mu    sync.Mutex
		conns []net.Conn
		r     holdResult
		next  atomic.Int64
		wg    sync.WaitGroup
	)
	for range max(c, 1) {
		wg.Go(func() {
			buf := make([]byte, respSize)
			d := net.Dialer{Timeout: 5 * time.Second}
			for next.Add(1) <= int64(n) && ctx.Err() == nil {
				conn, err := d.DialContext(ctx, "tcp", addr)
				if err == nil {
					conn.SetDeadline(time.Now().Add(5 * time.Second))
					if _, err = conn.Write(req); err == nil {
						_, err = io.ReadFull(conn, buf)
					}
					conn.SetDeadline(time.Time{})
					if err != nil {
						conn.Close()
					}
				}
				mu.Lock()
				if err != nil {
					r.Errors++
					if len(r.Texts) < 5 {
						r.Texts = append(r.Texts, err.Error())
					}
				} else {
					conns = append(conns, conn)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	r.Held = len(conns)
	return conns, r
}

// holdMain is `weirbench hold`: open the connections, print a holdResult
// line, hold them until killed (SIGTERM) or an hour has passed.
func holdMain(args []string) error {
	fs := newFlagSet("hold")
	addr := fs.String("addr", "", "server host:port")
	n := fs.Int("n", 1000, "connections")
	c := fs.Int("c", 32, "concurrent openers")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *addr == "" || *n <= 0 || *n > 15000 {
		return errors.New("hold: need -addr and 0 < -n <= 15000")
	}
	ctx, stop := signalContext()
	defer stop()
	conns, r := holdConns(ctx, *addr, *n, *c)
	if err := json.NewEncoder(os.Stdout).Encode(r); err != nil {
		return err
	}
	select {
	case <-ctx.Done():
	case <-time.After(time.Hour):
	}
	for _, c := range conns {
		c.Close()
	}
	return nil
}

// measureIdle holds n idle connections through weir and measures what they
// add to it.
func measureIdle(ctx context.Context, topo *topology, self, logDir string, weir *daemon, adm *admin, n int) (*idleResult, error) {
	type snap struct {
		rss int64
		mem goMem
		g   int
	}
	take := func() (snap, error) {
		var s snap
		var err error
		if s.mem, err = adm.memory(ctx); err != nil {
			return s, err
		}
		if s.g, err = adm.goroutines(ctx); err != nil {
			return s, err
		}
		s.rss, err = vmRSS(weir.pid())
		return s, err
	}
	time.Sleep(time.Second)
	before, err := take()
	if err != nil {
		return nil, err
	}
	hold, err := startDaemon(topo.client, logDir, "hold", nil, self, "hold",
		"-addr", net.JoinHostPort(weirVIP, strconv.Itoa(rrPort)), "-n", strconv.Itoa(n))
	if err != nil {
		return nil, err
	}
	defer hold.stop(5 * time.Second)
	var hr holdResult
	if err := waitFor(ctx, 3*time.Minute, hold, func() bool {
		b, _ := os.ReadFile(hold.logPath)
		sc := bufio.NewScanner(bytes.NewReader(b))
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "{") && json.Unmarshal(sc.Bytes(), &hr) == nil {
				return true
			}
		}
		return false
	}); err != nil {
		return nil, fmt.Errorf("hold: %w\n%s", err, hold.tail(2000))
	}
	if hr.Held == 0 {
		return nil, fmt.Errorf("hold: no connection held: %v", hr.Texts)
	}
	time.Sleep(2 * time.Second) // the last handshakes' timers and queues settle
	held, err := take()
	if err != nil {
		return nil, err
	}
	heapFile := filepath.Join(logDir, "heap-idle.pprof")
	var heapTop string
	if b, err := adm.get(ctx, "/debug/pprof/heap", 30*time.Second); err == nil && os.WriteFile(heapFile, b, 0o644) == nil {
		heapTop = pprofTop(ctx, heapFile, "-sample_index=inuse_space")
	}
	// Where the held connections' goroutines wait (their stacks are most
	// of an idle connection's cost): grouped by stack, largest groups first.
	if b, err := adm.get(ctx, "/debug/pprof/goroutine?debug=1", 30*time.Second); err == nil {
		_ = os.WriteFile(filepath.Join(logDir, "goroutines-idle.txt"), b, 0o644)
	}
	hold.stop(5 * time.Second)
	// weir lets the connections go before the harness stops it.
	_ = waitFor(ctx, 30*time.Second, weir, func() bool {
		g, err := adm.goroutines(ctx)
		return err == nil && g <= before.g+n/100+5
	})
	per := func(a, b int64) float64 { return float64(b-a) / 1024 / float64(hr.Held) }
	return &idleResult{
		Conns: hr.Held, Errors: hr.Errors,
		RSSKiBPerConn:     per(before.rss, held.rss),
		GoKiBPerConn:      per(before.mem.HeapInuse+before.mem.StackInuse, held.mem.HeapInuse+held.mem.StackInuse),
		HeapKiBPerConn:    per(before.mem.HeapInuse, held.mem.HeapInuse),
		StackKiBPerConn:   per(before.mem.StackInuse, held.mem.StackInuse),
		GoroutinesPerConn: float64(held.g-before.g) / float64(hr.Held),
		RSSBefore:         before.rss, RSSHeld: held.rss,
		HeapFile: heapFile, HeapTop: heapTop,
	}, nil
}

// vmRSS is the process's resident set now, in bytes.
func vmRSS(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	return statusKB(string(b), "VmRSS:")
}

// statusKB reads a "Key: N kB" line of /proc/PID/status, in bytes.
func statusKB(status, key string) (int64, error) {
	for _, line := range strings.Split(status, "\n") {
		if rest, ok := strings.CutPrefix(line, key); ok {
			f := strings.Fields(rest)
			if len(f) != 2 || f[1] != "kB" {
				return 0, fmt.Errorf("status: %s %q", key, rest)
			}
			kb, err := strconv.ParseInt(f[0], 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("status: no %s", key)
}
