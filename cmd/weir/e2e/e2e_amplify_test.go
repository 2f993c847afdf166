//go:build linux

package e2e

// The amplification budget (issue 23 Deliver 7), as Envoy's threat model
// states it: what a hostile client makes weir spend, against what it
// spends itself. Each hostile load runs in a child process (this test
// binary, TestHostileClient) inside weir's namespace, so its own CPU time
// is its rusage; weir's CPU is read from /proc/PID/stat and its resident
// memory from /proc/PID/status. Budgets, generous for a shared 2-core
// machine:
//
//   - memory: at most amplifyMemPerConn of weir's RSS per hostile
//     connection held open (slowloris, connect-and-idle), and at most
//     amplifyMemPerSYN per spoofed SYN (a half-open flood: cookies keep no
//     state past the backlog);
//   - CPU: weir's CPU time at most amplifyCPUFactor times the hostile
//     client's own for the same bytes (slowloris, many tiny requests,
//     pipelining, connect-and-idle), and amplifyCPUPerSYN per spoofed SYN.
//
// Every hostile connection also ends visibly: a 408 for slowloris, a
// response for every request, no connection left silent.

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"weir/cmd/weir/api"
)

const (
	amplifyMemPerConn = 128 << 10 // bytes of weir's RSS per hostile connection
	amplifyMemPerSYN  = 1 << 10   // bytes of weir's RSS per spoofed SYN
	amplifyCPUFactor  = 25.0      // weir's CPU time per the hostile client's
	amplifyCPUPerSYN  = 200e-6    // weir's CPU seconds per spoofed SYN
)

// hostileResult is what TestHostileClient reports on its last line.
type hostileResult struct {
	Conns    int            `json:"conns"`
	Requests int            `json:"requests"`
	Bytes    int64          `json:"bytes"`    // payload (SYN: packet) bytes sent
	Statuses map[string]int `json:"statuses"` // response status → count; "none": a connection or request that got none
	Err      string         `json:"err,omitempty"`
}

// TestHostileClient is the hostile client, run by TestE2EAmplificationBudget
// as a child process in weir's namespace (WEIR_E2E_HOSTILE names the load);
// it skips otherwise. Loads that hold connections print READY once every
// connection is open and has sent its first bytes, and close them when
// stdin closes; every load prints RESULT and its hostileResult last.
func TestHostileClient(t *testing.T) {
	mode := os.Getenv("WEIR_E2E_HOSTILE")
	if mode == "" {
		t.Skip("skipping: the hostile client of TestE2EAmplificationBudget, run as its child")
	}
	addr := os.Getenv("WEIR_E2E_ADDR")
	n, _ := strconv.Atoi(os.Getenv("WEIR_E2E_N"))
	r := hostileResult{Statuses: map[string]int{}}
	var mu sync.Mutex
	count := func(k string, bytes int64) {
		mu.Lock()
		r.Statuses[k]++
		r.Bytes += bytes
		mu.Unlock()
	}
	var err error
	switch mode {
	case "slowloris", "idle":
		err = holdConns(mode, addr, n, &r, count)
	case "tiny", "pipeline":
		err = tinyRequests(mode == "pipeline", addr, n, &r, count)
	case "syn":
		err = spoofSYNs(addr, n, &r)
	default:
		err = fmt.Errorf("unknown load %q", mode)
	}
	if err != nil {
		r.Err = err.Error()
	}
	b, _ := json.Marshal(r)
	fmt.Printf("RESULT %s\n", b)
}

func dialTimeout(addr string) (net.Conn, error) {
	return net.DialTimeout("tcp", addr, 10*time.Second)
}

// holdConns opens n connections. slowloris: each sends a request line and
// then a header line of 8 bytes every 250 ms, never the blank line, until
// weir answers (its 408) or closes. idle: each sends nothing. Both print
// READY once all are open; idle ones close when stdin does, and each
// reports the status it got ("none" when weir closed it without a
// response, "closed by the client" for an idle one still open at the end).
func holdConns(mode, addr string, n int, r *hostileResult, count func(string, int64)) error {
	conns := make([]net.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	var sent atomic.Int64
	for range n {
		c, err := dialTimeout(addr)
		if err != nil {
			return fmt.Errorf("dial %d: %w", len(conns), err)
		}
		conns = append(conns, c)
		c.SetDeadline(time.Now().Add(90 * time.Second))
		if mode == "slowloris" {
			m, err := io.WriteString(c, "GET /slow HTTP/1.1\r\nHost: amp\r\n")
			sent.Add(int64(m))
			if err != nil {
				return err
			}
		}
	}
	r.Conns = n
	fmt.Println("READY")
	stop := make(chan struct{})
	if mode == "idle" {
		go func() {
			io.Copy(io.Discard, os.Stdin)
			close(stop)
		}()
	}
	var wg sync.WaitGroup
	for _, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got := make(chan string, 1)
			go func() {
				resp, err := http.ReadResponse(bufio.NewReader(c), nil)
				if err != nil {
					got <- "none"
					return
				}
				resp.Body.Close()
				got <- strconv.Itoa(resp.StatusCode)
			}()
			tick := time.NewTicker(250 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case s := <-got:
					count(s, 0)
					return
				case <-stop:
					c.Close()
					<-got
					count("closed by the client", 0)
					return
				case <-tick.C:
					if mode == "slowloris" {
						m, _ := io.WriteString(c, "X-a: b\r\n")
						sent.Add(int64(m))
					}
				}
			}
		}()
	}
	wg.Wait()
	r.Bytes = sent.Load()
	return nil
}

// tinyRequests makes n requests of the smallest head over 8 keep-alive
// connections: one at a time, or (pipeline) in writes of 50 requests
// each, reading the 50 responses after.
func tinyRequests(pipeline bool, addr string, n int, r *hostileResult, count func(string, int64)) error {
	const conns, batch = 8, 50
	req := "GET / HTTP/1.1\r\nHost: a\r\n\r\n"
	r.Conns, r.Requests = conns, n
	var wg sync.WaitGroup
	errs := make(chan error, conns)
	for i := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := dialTimeout(addr)
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(120 * time.Second))
			br := bufio.NewReader(c)
			mine := n / conns
			if i < n%conns {
				mine++
			}
			for done := 0; done < mine; {
				k := 1
				if pipeline {
					k = min(batch, mine-done)
				}
				if _, err := io.WriteString(c, strings.Repeat(req, k)); err != nil {
					errs <- err
					return
				}
				for range k {
					resp, err := http.ReadResponse(br, nil)
					if err != nil {
						count("none", 0)
						errs <- err
						return
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					count(strconv.Itoa(resp.StatusCode), int64(len(req)))
				}
				done += k
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// spoofSYNs sends n spoofed SYNs from 198.19.0.0/16 to addr (IPv4) through
// a raw socket, 100 every 10 ms.
func spoofSYNs(addr string, n int, r *hostileResult) error {
	dst, err := netip.ParseAddrPort(addr)
	if err != nil {
		return err
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_RAW)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	to := &unix.SockaddrInet4{Addr: dst.Addr().As4()}
	pkt := make([]byte, 40)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for i := 0; i < n; {
		for j := 0; j < 100 && i < n; j, i = j+1, i+1 {
			spoofedSYN(pkt, [4]byte{198, 19, byte(i >> 8), byte(i)}, dst, uint16(1024+i%60000), uint32(i)*7919)
			if err := unix.Sendto(fd, pkt, 0, to); err != nil {
				return fmt.Errorf("sendto after %d: %w", i, err)
			}
			r.Bytes += int64(len(pkt))
		}
		<-tick.C
	}
	r.Conns = n
	return nil
}

// hostile is one run of the hostile child.
type hostile struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string
	result hostileResult
	cpu    float64 // the child's user+system seconds
}

// startHostile starts the child in weir's namespace.
func (w *weirProc) startHostile(mode, addr string, n int) *hostile {
	w.t.Helper()
	h := &hostile{lines: make(chan string, 16)}
	h.cmd = exec.Command(os.Args[0], "-test.run", "^TestHostileClient$", "-test.count", "1")
	h.cmd.Env = append(os.Environ(), "WEIR_E2E_HOSTILE="+mode, "WEIR_E2E_ADDR="+addr, "WEIR_E2E_N="+strconv.Itoa(n))
	h.cmd.Stderr = os.Stderr
	out, err := h.cmd.StdoutPipe()
	if err != nil {
		w.t.Fatal(err)
	}
	if h.stdin, err = h.cmd.StdinPipe(); err != nil {
		w.t.Fatal(err)
	}
	if err := w.ns.Do(h.cmd.Start); err != nil {
		w.t.Fatal(err)
	}
	w.t.Cleanup(func() {
		if h.cmd.ProcessState == nil {
			h.cmd.Process.Kill()
			h.cmd.Wait()
		}
	})
	go func() {
		defer close(h.lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			h.lines <- sc.Text()
		}
	}()
	return h
}

// waitLine waits for a line starting with prefix (the child's end: none).
func (h *hostile) waitLine(prefix string, d time.Duration) (string, bool) {
	timeout := time.After(d)
	for {
		select {
		case l, ok := <-h.lines:
			if !ok {
				return "", false
			}
			if strings.HasPrefix(l, prefix) {
				return l, true
			}
		case <-timeout:
			return "", false
		}
	}
}

// finish closes the child's stdin, reads its RESULT and waits for it.
func (h *hostile) finish(t *testing.T) {
	t.Helper()
	h.stdin.Close()
	l, ok := h.waitLine("RESULT ", 120*time.Second)
	if !ok {
		t.Fatalf("%v: the hostile client reported no result", h.cmd.Args)
	}
	if err := json.Unmarshal([]byte(strings.TrimPrefix(l, "RESULT ")), &h.result); err != nil {
		t.Fatal(err)
	}
	for range h.lines {
	}
	if err := h.cmd.Wait(); err != nil {
		t.Fatalf("the hostile client: %v", err)
	}
	h.cpu = (h.cmd.ProcessState.UserTime() + h.cmd.ProcessState.SystemTime()).Seconds()
	if h.result.Err != "" {
		t.Errorf("the hostile client: %s", h.result.Err)
	}
}

// TestE2EAmplificationBudget runs each hostile load against the amp
// service and asserts the budgets above. Soak tier: about a minute.
func TestE2EAmplificationBudget(t *testing.T) {
	w := startWeir(t, "hostile.yaml")
	w.backend("amp", "198.18.1.2:8082", 0)
	pid := w.pid()
	const vip = "198.18.0.44:80"
	// Warm up: the first requests grow weir's pools and buffers once.
	if res := w.load(vip, 4, 200); res.OK != 200 {
		t.Fatalf("warm-up: %+v", res)
	}
	type row struct {
		load             string
		conns            int
		bytes            int64
		weirCPU, cliCPU  float64
		rssGrow          int64
		perConn, cpuByte float64
	}
	var rows []row
	run := func(mode, addr string, n int, hold bool) (hostileResult, row) {
		t.Helper()
		rss0 := vmRSS(t, pid)
		cpu0 := cpuSeconds(t, pid)
		h := w.startHostile(mode, addr, n)
		peak := rss0
		if hold {
			if _, ok := h.waitLine("READY", 60*time.Second); !ok {
				t.Fatalf("%s: the hostile client never had its %d connections open", mode, n)
			}
			// Every connection is weir's now: its memory is held.
			w.waitStatus(30*time.Second, fmt.Sprintf("%d %s client connections open at weir", n, mode), func(st api.Status) bool {
				return st.Forwarder.HTTPClients >= int64(n)
			})
			peak = vmRSS(t, pid)
		}
		h.finish(t)
		if !hold {
			peak = vmRSS(t, pid)
		}
		rw := row{load: mode, conns: n, bytes: h.result.Bytes, weirCPU: cpuSeconds(t, pid) - cpu0, cliCPU: h.cpu, rssGrow: peak - rss0}
		rw.perConn = float64(rw.rssGrow) / float64(n)
		if h.result.Bytes > 0 {
			rw.cpuByte = rw.weirCPU / float64(h.result.Bytes)
		}
		rows = append(rows, rw)
		t.Logf("%s: %d hostile %s, %d bytes; weir CPU %.3f s (client %.3f s, ×%.1f), %.2f µs per byte; weir RSS %+.1f MiB (%.1f KiB each); outcomes %v",
			mode, n, map[bool]string{true: "connections", false: "requests or SYNs"}[hold], h.result.Bytes, rw.weirCPU, rw.cliCPU, rw.weirCPU/max(rw.cliCPU, 1e-3), rw.cpuByte*1e6,
			float64(rw.rssGrow)/(1<<20), rw.perConn/1024, h.result.Statuses)
		return h.result, rw
	}
	checkCPU := func(rw row) {
		t.Helper()
		// A client that spent under 10 ms is held to 10 ms: below it,
		// weir's own background work (sampling, STATS) dominates.
		if f := rw.weirCPU / max(rw.cliCPU, 0.01); f > amplifyCPUFactor {
			t.Errorf("%s: weir spent %.3f s of CPU for the client's %.3f s: ×%.1f, budget ×%.0f", rw.load, rw.weirCPU, rw.cliCPU, f, amplifyCPUFactor)
		}
	}
	checkMem := func(rw row) {
		t.Helper()
		if rw.perConn > amplifyMemPerConn {
			t.Errorf("%s: weir's RSS grew %.1f KiB per hostile connection, budget %d KiB", rw.load, rw.perConn/1024, amplifyMemPerConn>>10)
		}
	}

	// Slowloris: 300 heads that never end. Each gets its 408 at
	// headerTimeout (10 s on amp), none is left silent.
	const loris = 300
	timeouts0 := w.status().Forwarder.HTTPHeaderTimeout
	res, rw := run("slowloris", vip, loris, true)
	if res.Statuses["408"] != loris {
		t.Errorf("slowloris: %v, want %d × 408", res.Statuses, loris)
	}
	if got := w.status().Forwarder.HTTPHeaderTimeout - timeouts0; got != loris {
		t.Errorf("slowloris: weir_http_header_timeouts_total rose %d, want %d", got, loris)
	}
	checkMem(rw)
	checkCPU(rw)

	// Connect-and-idle: 500 connections that never send a byte, closed by
	// the client once counted.
	res, rw = run("idle", vip, 500, true)
	if res.Statuses["closed by the client"] != 500 {
		t.Errorf("idle: %v, want all 500 open until the client closed them", res.Statuses)
	}
	checkMem(rw)
	checkCPU(rw)
	w.waitStatus(30*time.Second, "the idle connections gone", func(st api.Status) bool { return st.Forwarder.HTTPClients == 0 })

	// Many tiny requests, one at a time and pipelined 50 deep.
	for _, mode := range []string{"tiny", "pipeline"} {
		res, rw = run(mode, vip, 8000, false)
		if res.Statuses["200"] != 8000 {
			t.Errorf("%s: %v, want 8000 × 200", mode, res.Statuses)
		}
		checkCPU(rw)
	}

	// A half-open flood: 20 000 spoofed SYNs at 10 000/s.
	const syns = 20000
	res, rw = run("syn", vip, syns, false)
	if float64(rw.rssGrow)/syns > amplifyMemPerSYN {
		t.Errorf("syn: weir's RSS grew %.0f B per spoofed SYN, budget %d B", float64(rw.rssGrow)/syns, amplifyMemPerSYN)
	}
	if per := rw.weirCPU / syns; per > amplifyCPUPerSYN {
		t.Errorf("syn: weir spent %.0f µs of CPU per spoofed SYN, budget %.0f µs", per*1e6, amplifyCPUPerSYN*1e6)
	}
	// Real clients are served after it all.
	if res := w.load(vip, 4, 200); res.OK != 200 {
		t.Errorf("after the hostile loads: %+v", res)
	}
	t.Log("the machine is shared by up to 7 helpers: the CPU figures are its as much as weir's")
}
