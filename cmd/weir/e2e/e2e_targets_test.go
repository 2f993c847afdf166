//go:build linux

package e2e

// Targets that do what a simple HTTP backend never does (issue 23
// Deliver 7), over IPv4 and IPv6: a target that speaks first (an SMTP
// banner) on a tcp service, a target that resets in the middle of its
// response on an http service, and a 16 MiB transfer each way through
// the smallest socket buffers the kernel gives, with a client that stops
// reading (Envoy's TcpProxyLargeWrite).

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"weir/cmd/weir/api"
	"weir/internal/testutil"
)

// serveConns accepts on ln and runs handle for each connection in its own
// goroutine; the connections close when the test ends.
func (w *weirProc) serveConns(ln net.Listener, handle func(net.Conn)) {
	var mu sync.Mutex
	var open []net.Conn
	var wg sync.WaitGroup
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			open = append(open, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				handle(c)
			}()
		}
	}()
	w.t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range open {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
}

// TestE2EServerSpeaksFirst: a tcp service's target that sends its banner
// before the client sends anything (SMTP) reaches a client that waits for
// it, one client after another and 20 at once, over IPv4 and IPv6; the
// dialogue after it works both ways, and once every client has quit no
// connection is left open at the target.
func TestE2EServerSpeaksFirst(t *testing.T) {
	w := startWeir(t, "hostile.yaml")
	w.serveConns(w.listen("198.18.1.2:2525"), func(c net.Conn) {
		c.SetDeadline(time.Now().Add(60 * time.Second))
		fmt.Fprintf(c, "220 mta.weir.test ESMTP ready\r\n")
		sc := bufio.NewScanner(c)
		for sc.Scan() {
			switch l := sc.Text(); {
			case strings.HasPrefix(l, "QUIT"):
				fmt.Fprintf(c, "221 bye\r\n")
				return
			default:
				fmt.Fprintf(c, "250 ok %s\r\n", l)
			}
		}
	})
	session := func(addr string, i int) error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, err := w.ns.Dial(ctx, "tcp", addr)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(20 * time.Second))
		br := bufio.NewReader(c)
		// The client sends nothing until the banner is in.
		banner, err := br.ReadString('\n')
		if err != nil || banner != "220 mta.weir.test ESMTP ready\r\n" {
			return fmt.Errorf("banner %q: %v", banner, err)
		}
		fmt.Fprintf(c, "EHLO client%d\r\n", i)
		if l, err := br.ReadString('\n'); err != nil || l != fmt.Sprintf("250 ok EHLO client%d\r\n", i) {
			return fmt.Errorf("EHLO: %q %v", l, err)
		}
		fmt.Fprintf(c, "QUIT\r\n")
		if l, err := br.ReadString('\n'); err != nil || l != "221 bye\r\n" {
			return fmt.Errorf("QUIT: %q %v", l, err)
		}
		// The target closed: weir's FIN follows.
		if b, err := br.ReadByte(); err != io.EOF {
			return fmt.Errorf("after 221: %q %v, want EOF", b, err)
		}
		return nil
	}
	for _, ipv := range ipVersions() {
		addr := ipv.vip(41, 25)
		start := time.Now()
		for i := range 20 {
			if err := session(addr, i); err != nil {
				t.Fatalf("%s: sequential session %d: %v", ipv.name, i, err)
			}
		}
		seq := time.Since(start)
		start = time.Now()
		errs := make(chan error, 20)
		for i := range 20 {
			go func() { errs <- session(addr, 100+i) }()
		}
		for range 20 {
			if err := <-errs; err != nil {
				t.Errorf("%s: concurrent session: %v", ipv.name, err)
			}
		}
		t.Logf("%s: 20 sequential SMTP sessions in %v, 20 concurrent in %v", ipv.name, seq.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
	}
	st := w.waitStatus(10*time.Second, "every smtp connection closed", func(st api.Status) bool {
		s := statusService(st, "smtp")
		return s != nil && len(s.Targets) == 1 && s.Targets[0].Open == 0
	})
	if s := statusService(st, "smtp"); s.Targets[0].Picked != 80 || s.Targets[0].Down {
		t.Errorf("smtp target: picked %d (want 80), down %v", s.Targets[0].Picked, s.Targets[0].Down)
	}
}

// accessRecords reads weir's JSON access log.
func accessRecords(t *testing.T, path string) []map[string]any {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("access log line %q: %v", l, err)
		}
		out = append(out, m)
	}
	return out
}

// TestE2ETargetResetMidBody: an http service's target that resets its
// connection (SO_LINGER 0) before its response head, or after the head and
// part of a body framed by Content-Length, by chunks or by the close. The
// client gets a 502 before the head; after it, a response it can tell is
// cut (short of its Content-Length, no last chunk, or a reset rather than
// a FIN); the access log writes each with its status and the outcome
// bad_gateway, and weir_http_bad_gateway_total counts them.
func TestE2ETargetResetMidBody(t *testing.T) {
	access := filepath.Join(t.TempDir(), "access.log")
	w := startWeir(t, "hostile.yaml", "--access-log", access)
	// The target resets once weir has acknowledged what it sent (its
	// send queue is empty): a RST discards what is still queued. A small
	// part fits weir's response buffer, a large one does not.
	large, _ := io.ReadAll(newStream(4, 256<<10))
	parts := map[string]string{"small": strings.Repeat("p", 56), "large": fmt.Sprintf("%x", large)}
	w.serveConns(w.listen("198.18.1.3:8083"), func(c net.Conn) {
		c.SetDeadline(time.Now().Add(30 * time.Second))
		req, err := http.ReadRequest(bufio.NewReader(c))
		if err != nil {
			return
		}
		reset := func() {
			tc := c.(*net.TCPConn)
			if rc, err := tc.SyscallConn(); err == nil {
				testutil.WithinEvery(10*time.Second, 5*time.Millisecond, func() bool {
					queued := -1
					rc.Control(func(fd uintptr) { queued, _ = unix.IoctlGetInt(int(fd), unix.SIOCOUTQ) })
					return queued == 0
				})
			}
			tc.SetLinger(0)
			tc.Close()
		}
		// /KIND-SIZE-FAMILY: a response framed by KIND, SIZE bytes of it
		// sent before the reset.
		path := strings.TrimPrefix(req.URL.Path, "/")
		f := strings.Split(path, "-")
		kind := f[0]
		var body string
		if len(f) == 3 {
			body = parts[f[1]]
		}
		switch kind {
		case "before":
			reset()
			return
		case "length":
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", 2*len(body), body)
		case "chunked":
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n", len(body), body)
		case "close":
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n%s", body)
		case "ok":
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
			return
		}
		reset()
	})
	type result struct {
		status int
		got    string
		err    error // how the body ended
	}
	get := func(addr, path string) (result, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, err := w.ns.Dial(ctx, "tcp", addr)
		if err != nil {
			return result{}, err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(20 * time.Second))
		fmt.Fprintf(c, "GET /%s HTTP/1.1\r\nHost: reset\r\n\r\n", path)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return result{}, fmt.Errorf("no response head: %w", err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return result{status: resp.StatusCode, got: string(b), err: err}, nil
	}
	waitUp := func() {
		w.waitStatus(10*time.Second, "the reset target up again (retryInterval 1s)", func(st api.Status) bool {
			s := statusService(st, "reset")
			return s != nil && len(s.Targets) == 1 && !s.Targets[0].Down
		})
	}
	want := map[string]int{} // request → the status logged
	cuts := 0
	for _, ipv := range ipVersions() {
		addr := ipv.vip(43, 80)
		paths := []string{"before-" + ipv.name}
		for _, kind := range []string{"length", "chunked", "close"} {
			paths = append(paths, kind+"-small-"+ipv.name, kind+"-large-"+ipv.name)
		}
		for _, path := range paths {
			waitUp()
			r, err := get(addr, path)
			if err != nil {
				t.Fatalf("%s: %v", path, err)
			}
			cuts++
			t.Logf("%s: status %d, %d body bytes, ended by %v", path, r.status, len(r.got), r.err)
			sent := parts[strings.Split(path, "-")[1]]
			switch {
			case !strings.Contains(path, "large"):
				// Nothing reached the client before the reset (weir
				// holds up to 16 KiB of a response before it writes):
				// a 502, not the target's head.
				if r.status != 502 {
					t.Errorf("%s: status %d %q, want 502", path, r.status, r.got)
				}
				want["GET /"+path] = 502
			default:
				// The head and some of the body went out: the client
				// has a prefix of it and can tell it was cut.
				if r.status != 200 || len(r.got) == 0 || len(r.got) > len(sent) || r.got != sent[:len(r.got)] {
					t.Errorf("%s: status %d, %d bytes (a prefix of the %d sent: %v), want 200 and a prefix", path, r.status, len(r.got), len(sent), strings.HasPrefix(sent, r.got))
				}
				if r.err == nil {
					t.Errorf("%s: the cut response looks complete to the client (a clean end of body after %d bytes)", path, len(r.got))
				}
				want["GET /"+path] = 200
			}
		}
		// The target serves again after each reset.
		waitUp()
		if r, err := get(addr, "ok-"+ipv.name); err != nil || r.status != 200 || r.got != "ok" {
			t.Errorf("%s: after the resets: %+v %v", ipv.name, r, err)
		}
	}
	st := w.status()
	if got := st.Forwarder.HTTPBadGateway; got != uint64(cuts) {
		t.Errorf("weir_http_bad_gateway_total %d, want %d (every reset)", got, cuts)
	}
	w.signal(os.Interrupt) // weir flushes the access log on exit
	if _, err := w.Wait(10 * time.Second); err != nil {
		t.Fatalf("weir did not exit on SIGINT: %v", err)
	}
	logged := map[string]string{}
	for _, rec := range accessRecords(t, access) {
		req, _ := rec["request"].(string)
		status, _ := rec["status"].(float64)
		outcome, _ := rec["outcome"].(string)
		if f := strings.Fields(req); len(f) >= 2 {
			logged[f[0]+" "+f[1]] = fmt.Sprintf("%d %s", int(status), outcome)
		}
	}
	for req, status := range want {
		if got := logged[req]; got != fmt.Sprintf("%d bad-gateway", status) {
			t.Errorf("access log: %s logged %q, want %d bad-gateway", req, got, status)
		}
	}
	t.Logf("access log: %v", logged)
}

// smallBuffers is a socket Control that asks for 1 KiB send and receive
// buffers (the kernel's minimum is larger: it doubles and clamps them, to
// 4.5 and 2.3 KiB on Linux), before connect or listen so the window scale
// follows.
func smallBuffers(_, _ string, rc syscall.RawConn) error {
	var serr error
	if err := rc.Control(func(fd uintptr) {
		if serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, 1024); serr == nil {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUF, 1024)
		}
	}); err != nil {
		return err
	}
	return serr
}

// stream is n bytes of a seeded pseudo-random stream.
type stream struct {
	r *rand.ChaCha8
	n int64
}

func newStream(seed byte, n int64) *stream {
	var s [32]byte
	s[0] = seed
	return &stream{r: rand.NewChaCha8(s), n: n}
}

func (s *stream) Read(p []byte) (int, error) {
	if s.n <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > s.n {
		p = p[:s.n]
	}
	n, _ := s.r.Read(p)
	s.n -= int64(n)
	return n, nil
}

func digest(r io.Reader) (string, int64, error) {
	h := sha256.New()
	n, err := io.Copy(h, r)
	return fmt.Sprintf("%x", h.Sum(nil)), n, err
}

// vmRSS is a process's resident set in bytes.
func vmRSS(t *testing.T, pid int) int64 {
	t.Helper()
	var kb int64
	fmt.Sscanf(procStatus(t, fmt.Sprintf("/proc/%d/status", pid))["VmRSS"], "%d kB", &kb)
	return kb << 10
}

// TestE2ELargeWriteSmallBuffers is Envoy's TcpProxyLargeWrite through the
// real binary: 16 MiB up and 16 MiB down a tcp service, with the client's
// and the target's socket buffers at the kernel's minimum, bytes intact
// (SHA-256 both ends); then a client that stops reading a 64 MiB download:
// the target is held back (it cannot write it all), weir's resident memory
// grows by less than the download's size, and once the client reads again
// every byte arrives intact.
func TestE2ELargeWriteSmallBuffers(t *testing.T) {
	w := startWeir(t, "hostile.yaml")
	const size = 16 << 20
	const stall = 64 << 20
	var lc net.ListenConfig
	lc.Control = smallBuffers
	var ln net.Listener
	if err := w.ns.Do(func() (err error) {
		ln, err = lc.Listen(context.Background(), "tcp", "198.18.1.3:9000")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	type written struct {
		n   int64
		err error
	}
	stalled := make(chan written, 1)
	// The target: "up N" reads N bytes and answers their digest; "down N
	// SEED" writes N bytes of the stream; "stall N SEED" writes N bytes
	// with a 2 s deadline per write, reporting how far it got when a
	// write cannot go on, and then writes the rest.
	w.serveConns(ln, func(c net.Conn) {
		c.SetDeadline(time.Now().Add(120 * time.Second))
		br := bufio.NewReader(c)
		cmd, err := br.ReadString('\n')
		if err != nil {
			return
		}
		var n int64
		var seed byte
		switch {
		case strings.HasPrefix(cmd, "up "):
			fmt.Sscanf(cmd, "up %d", &n)
			d, got, err := digest(io.LimitReader(br, n))
			fmt.Fprintf(c, "%s %d %v\n", d, got, err)
		case strings.HasPrefix(cmd, "down "):
			fmt.Sscanf(cmd, "down %d %d", &n, &seed)
			io.Copy(c, newStream(seed, n))
		case strings.HasPrefix(cmd, "stall "):
			fmt.Sscanf(cmd, "stall %d %d", &n, &seed)
			s := newStream(seed, n)
			buf := make([]byte, 64<<10)
			var sent int64
			reported := false
			for sent < n {
				m, _ := s.Read(buf)
				for off := 0; off < m; {
					c.SetWriteDeadline(time.Now().Add(2 * time.Second))
					k, err := c.Write(buf[off:m])
					off += k
					sent += int64(k)
					if err != nil {
						var ne net.Error
						if !errors.As(err, &ne) || !ne.Timeout() {
							return
						}
						if !reported {
							reported = true
							stalled <- written{sent, nil}
						}
					}
				}
			}
			if !reported {
				stalled <- written{sent, errors.New("never held back")}
			}
		}
	})
	dial := func(addr string) net.Conn {
		t.Helper()
		d := net.Dialer{Control: smallBuffers, Timeout: 10 * time.Second}
		var c net.Conn
		if err := w.ns.Do(func() (err error) {
			c, err = d.Dial("tcp", addr)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(120 * time.Second))
		return c
	}
	pid := w.pid()
	for _, ipv := range ipVersions() {
		addr := ipv.vip(42, 9000)
		// Up: 16 MiB from the client, digested at the target.
		c := dial(addr)
		start := time.Now()
		fmt.Fprintf(c, "up %d\n", size)
		wantUp, _, _ := digest(newStream(1, size))
		go io.Copy(c, newStream(1, size))
		line, err := bufio.NewReader(c).ReadString('\n')
		c.Close()
		if want := fmt.Sprintf("%s %d <nil>\n", wantUp, size); err != nil || line != want {
			t.Fatalf("%s: up: target got %q (%v), want %q", ipv.name, line, err, want)
		}
		up := time.Since(start)
		// Down: 16 MiB from the target, read 1 KiB at a time.
		c = dial(addr)
		start = time.Now()
		fmt.Fprintf(c, "down %d 2\n", size)
		got, n, err := digest(bufio.NewReaderSize(c, 1024))
		c.Close()
		wantDown, _, _ := digest(newStream(2, size))
		if err != nil || n != size || got != wantDown {
			t.Fatalf("%s: down: %d bytes, digest match %v, %v", ipv.name, n, got == wantDown, err)
		}
		down := time.Since(start)
		// Stall: the client reads nothing until the target is held back.
		rss0 := vmRSS(t, pid)
		c = dial(addr)
		fmt.Fprintf(c, "stall %d 3\n", stall)
		var held written
		select {
		case held = <-stalled:
		case <-time.After(60 * time.Second):
			t.Fatalf("%s: the stalled download: the target neither finished nor was held back", ipv.name)
		}
		rss1 := vmRSS(t, pid)
		got, n, err = digest(c)
		c.Close()
		wantStall, _, _ := digest(newStream(3, stall))
		t.Logf("%s: 16 MiB up in %v, down in %v (1 KiB reads); a client that stopped reading held the target at %.1f MiB of %d MiB, weir's RSS %.1f → %.1f MiB (machine shared)",
			ipv.name, up.Round(time.Millisecond), down.Round(time.Millisecond), float64(held.n)/(1<<20), stall>>20, float64(rss0)/(1<<20), float64(rss1)/(1<<20))
		if held.err != nil {
			t.Errorf("%s: the target wrote all %d MiB to a client that read nothing: weir buffers without bound", ipv.name, stall>>20)
		}
		if grow := rss1 - rss0; grow > 24<<20 {
			t.Errorf("%s: weir's RSS grew %.1f MiB while one client did not read (bound 24 MiB)", ipv.name, float64(grow)/(1<<20))
		}
		if err != nil || n != stall || got != wantStall {
			t.Errorf("%s: stalled download: %d of %d bytes, digest match %v, %v", ipv.name, n, stall, got == wantStall, err)
		}
	}
	w.waitStatus(10*time.Second, "every bulk connection closed", func(st api.Status) bool {
		s := statusService(st, "bulk")
		return s != nil && len(s.Targets) == 1 && s.Targets[0].Open == 0
	})
}
