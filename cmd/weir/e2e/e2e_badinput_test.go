//go:build linux

package e2e

// The HTTP bad-input table (issue 23 Deliver 7), as HAProxy's
// h1_request_target_validation.vtc and h2_desync_attacks.vtc pin theirs:
// each hostile or odd request head through the real binary, the status the
// client gets, and what the target may see. The target records every
// request it parses; after each case a sentinel request on a new
// connection must be the first thing the target sees since the case began
// (weir's target connections are pooled and in order, so anything the
// case smuggled through would come before it).

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// recorder is a target that records the request line and Host of every
// request it parses, and the raw bytes it received; it answers each with
// 200 and a body naming the request's sequence number.
type recorder struct {
	mu    sync.Mutex
	reqs  []string // "METHOD URI host=HOST body=N"
	raw   bytes.Buffer
	conns int
}

// recConn tees what the target reads into the recorder.
type recConn struct {
	net.Conn
	r *recorder
}

func (c recConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.r.mu.Lock()
	c.r.raw.Write(p[:n])
	c.r.mu.Unlock()
	return n, err
}

// recordingTarget serves a recorder on addr inside weir's namespace.
func (w *weirProc) recordingTarget(addr string) *recorder {
	w.t.Helper()
	r := &recorder{}
	ln := w.listen(addr)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var open []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			open = append(open, c)
			mu.Unlock()
			r.mu.Lock()
			r.conns++
			r.mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				br := bufio.NewReader(recConn{c, r})
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					n, _ := io.Copy(io.Discard, req.Body)
					r.mu.Lock()
					r.reqs = append(r.reqs, fmt.Sprintf("%s %s host=%s body=%d", req.Method, req.RequestURI, req.Host, n))
					seq := len(r.reqs)
					r.mu.Unlock()
					body := "seen " + strconv.Itoa(seq) + "\n"
					if _, err := fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(body), body); err != nil {
						return
					}
				}
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
	return r
}

// seen is the requests recorded so far.
func (r *recorder) seen() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.reqs...)
}

// rawExchange writes payload on a new connection to addr (from a goroutine:
// a large payload may not all be read) and reads the responses until the
// connection ends; it returns their statuses.
func (w *weirProc) rawExchange(addr string, payload []byte) ([]int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := w.ns.Dial(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(15 * time.Second))
	// The payload, then the client's FIN: weir answers what it read and
	// closes, so any response the table does not expect shows.
	wrote := make(chan struct{})
	go func() {
		defer close(wrote)
		if _, err := c.Write(payload); err == nil {
			c.(interface{ CloseWrite() error }).CloseWrite()
		}
	}()
	defer func() { <-wrote }()
	br := bufio.NewReader(c)
	var st []int
	for {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return st, fmt.Errorf("after %v: weir neither answered nor closed: %w", st, err)
			}
			if len(st) == 0 {
				return nil, fmt.Errorf("no response: %w", err)
			}
			break
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		st = append(st, resp.StatusCode)
	}
	c.Close() // ends the writer of a payload weir stopped reading
	return st, nil
}

// badInputCase is one row of the table: the bytes sent, the statuses the
// client gets in order, and the requests the target sees (nil: nothing).
type badInputCase struct {
	name   string
	send   string
	status []int
	target []string
}

func badInputCases() []badInputCase {
	const h = "Host: web\r\n"
	big := strings.Repeat("a", 1<<20)
	longURI := "/" + strings.Repeat("u", 65<<10)
	ok := []int{200}
	bad := []int{400}
	return []badInputCase{
		// The baseline: a plain request, keep-alive.
		{"plain GET", "GET /plain HTTP/1.1\r\n" + h + "\r\n", ok, []string{"GET /plain host=web body=0"}},
		{"POST with a body", "POST /up HTTP/1.1\r\n" + h + "Content-Length: 5\r\nConnection: close\r\n\r\nhello", ok, []string{"POST /up host=web body=5"}},
		{"chunked POST", "POST /ch HTTP/1.1\r\n" + h + "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n5\r\nhello\r\n0\r\n\r\n", ok, []string{"POST /ch host=web body=5"}},

		// Request smuggling: the framings a front and a back end may read
		// differently are refused before anything reaches the target.
		{"CL then TE", "POST /s HTTP/1.1\r\n" + h + "Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\n" + h + "\r\n", bad, nil},
		{"TE then CL", "POST /s HTTP/1.1\r\n" + h + "Transfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\n" + h + "\r\n", bad, nil},
		{"TE obs-fold with CL", "POST /s HTTP/1.1\r\n" + h + "Content-Length: 4\r\nTransfer-Encoding:\r\n chunked\r\n\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\n" + h + "\r\n", bad, nil},
		{"TE obs-fold alone", "POST /s HTTP/1.1\r\n" + h + "Transfer-Encoding:\r\n chunked\r\n\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\n" + h + "\r\n", bad, nil},
		{"obs-fold in another header", "GET /f HTTP/1.1\r\n" + h + "X-A: one\r\n two\r\n\r\n", bad, nil},
		{"two different CLs", "POST /s HTTP/1.1\r\n" + h + "Content-Length: 4\r\nContent-Length: 40\r\n\r\nGET /smuggled HTTP/1.1\r\n" + h + "\r\n", bad, nil},
		{"CL list", "POST /s HTTP/1.1\r\n" + h + "Content-Length: 4, 40\r\n\r\nGET /smuggled HTTP/1.1\r\n" + h + "\r\n", bad, nil},
		{"CL with a sign", "POST /s HTTP/1.1\r\n" + h + "Content-Length: +4\r\n\r\nabcd", bad, nil},
		{"CL not a number", "POST /s HTTP/1.1\r\n" + h + "Content-Length: 0x4\r\n\r\nabcd", bad, nil},
		{"space before the colon", "POST /s HTTP/1.1\r\n" + h + "Transfer-Encoding : chunked\r\nContent-Length: 4\r\n\r\n0\r\n\r\n", bad, nil},
		{"TE not chunked", "POST /s HTTP/1.1\r\n" + h + "Transfer-Encoding: xchunked\r\n\r\n0\r\n\r\n", bad, nil},
		{"TE chunked then identity", "POST /s HTTP/1.1\r\n" + h + "Transfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n", bad, nil},
		{"TE twice", "POST /s HTTP/1.1\r\n" + h + "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", bad, nil},
		{"NUL in a header value", "GET /n HTTP/1.1\r\n" + h + "X-A: a\x00b\r\n\r\n", bad, nil},
		{"CR alone ends a line", "GET /cr HTTP/1.1\r" + h + "\r\n", bad, nil},

		// Malformed heads: 400 (431 when too large), closed, nothing at
		// the target.
		{"1 MiB header", "GET /big HTTP/1.1\r\n" + h + "X-Big: " + big + "\r\n\r\n", []int{431}, nil},
		{"request line over 64 KiB", "GET " + longURI + " HTTP/1.1\r\n" + h + "\r\n", []int{431}, nil},
		{"invalid method", "G(T / HTTP/1.1\r\n" + h + "\r\n", bad, nil},
		{"header without a colon", "GET / HTTP/1.1\r\n" + h + "NoColon\r\n\r\n", bad, nil},
		{"HTTP/0.9", "GET /\r\n\r\n", bad, nil},
		{"no version", "GET / \r\n" + h + "\r\n", bad, nil},
		{"HTTP/1.1 without Host", "GET /nohost HTTP/1.1\r\n\r\n", bad, nil},
		{"two Hosts", "GET /twohosts HTTP/1.1\r\n" + h + "Host: other\r\n\r\n", bad, nil},
		{"Host with a space", "GET /h HTTP/1.1\r\nHost: a b\r\n\r\n", bad, nil},

		// Decided: weir is a reverse proxy of HTTP/1.x. CONNECT would make
		// the connection a tunnel weir then reads as requests: 501. Any
		// other version (the HTTP/2 preface included): 505.
		{"CONNECT", "CONNECT web:443 HTTP/1.1\r\n" + h + "\r\n", []int{501}, nil},
		{"HTTP/2.0 request line", "GET /h2 HTTP/2.0\r\n" + h + "\r\n", []int{505}, nil},
		{"HTTP/2 preface", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", []int{505}, nil},
		{"HTTP/3.0", "GET /h3 HTTP/3.0\r\n" + h + "\r\n", []int{505}, nil},

		// Accepted, and what the target sees is normalised.
		{"bare LF", "GET /lf HTTP/1.1\n" + h[:len(h)-2] + "\n\n", ok, []string{"GET /lf host=web body=0"}},
		{"absolute-form", "GET http://abs.example/p?q=1 HTTP/1.1\r\n" + h + "\r\n", ok, []string{"GET /p?q=1 host=abs.example body=0"}},
		{"HTTP/1.0 without Host", "GET /old HTTP/1.0\r\n\r\n", ok, []string{"GET /old host= body=0"}},
		{"same CL twice", "POST /cl2 HTTP/1.1\r\n" + h + "Content-Length: 3\r\nContent-Length: 3\r\n\r\nabc", ok, []string{"POST /cl2 host=web body=3"}},
		{"OPTIONS *", "OPTIONS * HTTP/1.1\r\n" + h + "\r\n", ok, []string{"OPTIONS * host=web body=0"}},

		// Pipelining: answered in order; a bad request after good ones
		// ends the connection there.
		{"three pipelined", "GET /p1 HTTP/1.1\r\n" + h + "\r\nGET /p2 HTTP/1.1\r\n" + h + "\r\nGET /p3 HTTP/1.1\r\n" + h + "\r\n", []int{200, 200, 200},
			[]string{"GET /p1 host=web body=0", "GET /p2 host=web body=0", "GET /p3 host=web body=0"}},
		{"pipelined POST then GET", "POST /pp HTTP/1.1\r\n" + h + "Content-Length: 3\r\n\r\nabcGET /pg HTTP/1.1\r\n" + h + "\r\n", []int{200, 200},
			[]string{"POST /pp host=web body=3", "GET /pg host=web body=0"}},
		{"pipelined smuggling after a good one", "GET /g HTTP/1.1\r\n" + h + "\r\nPOST /s HTTP/1.1\r\n" + h + "Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\n" + h + "\r\n",
			[]int{200, 400}, []string{"GET /g host=web body=0"}},
	}
}

// TestE2EBadInput runs the table over IPv4 and IPv6 and checks weir's
// counters: every refused head counts in weir_http_bad_requests_total or
// weir_http_header_too_big_total, and no target connection was ever reset
// or marked down by a client's bad request.
func TestE2EBadInput(t *testing.T) {
	access := filepath.Join(t.TempDir(), "access.log")
	w := startWeir(t, "hostile.yaml", "--access-log", access)
	rec := w.recordingTarget("198.18.1.1:8081")
	cases := badInputCases()
	refused := 0
	for _, c := range cases {
		for _, s := range c.status {
			if s != 200 {
				refused++
			}
		}
	}
	for _, ipv := range ipVersions() {
		vip := ipv.vip(40, 80)
		for _, c := range cases {
			t.Run(ipv.name+"/"+c.name, func(t *testing.T) {
				before := len(rec.seen())
				st, err := w.rawExchange(vip, []byte(c.send))
				if err != nil {
					t.Fatalf("%s: %v", c.name, err)
				}
				if fmt.Sprint(st) != fmt.Sprint(c.status) {
					t.Errorf("statuses %v, want %v", st, c.status)
				}
				// The sentinel: once its answer is back, everything the
				// case sent the target is recorded before it.
				sent, err := w.rawExchange(vip, []byte("GET /sentinel HTTP/1.1\r\nHost: web\r\nConnection: close\r\n\r\n"))
				if err != nil || len(sent) != 1 || sent[0] != 200 {
					t.Fatalf("sentinel: %v %v", sent, err)
				}
				got := rec.seen()[before:]
				want := append(append([]string(nil), c.target...), "GET /sentinel host=web body=0")
				if strings.Join(got, "\n") != strings.Join(want, "\n") {
					t.Errorf("the target saw\n\t%s\nwant\n\t%s", strings.Join(got, "\n\t"), strings.Join(want, "\n\t"))
				}
			})
		}
	}
	st := w.status()
	bad := st.Forwarder.HTTPBadRequest + st.Forwarder.HTTPHeaderTooBig
	t.Logf("%d cases over IPv4 and IPv6; weir counted %d refused heads (want %d); the target saw %d requests on %d connections",
		len(cases), bad, 2*refused, len(rec.seen()), rec.conns)
	if int(bad) != 2*refused {
		t.Errorf("weir counted %d refused request heads, the table expects %d", bad, 2*refused)
	}
	if s := statusService(st, "web"); s == nil || len(s.Targets) != 1 || s.Targets[0].Down || s.Targets[0].Failed != 0 {
		t.Errorf("a client's bad input marked the target down: %+v", s)
	}
	// Each refused head has its access-log line with the status sent.
	w.signal(os.Interrupt) // weir flushes the access log on exit
	if _, err := w.Wait(10 * time.Second); err != nil {
		t.Fatalf("weir did not exit on SIGINT: %v", err)
	}
	logged := map[int]int{}
	for _, r := range accessRecords(t, access) {
		if st, _ := r["status"].(float64); st != 200 && st != 0 {
			logged[int(st)]++
		}
	}
	want := map[int]int{}
	for _, c := range cases {
		for _, s := range c.status {
			if s != 200 {
				want[s] += 2
			}
		}
	}
	if fmt.Sprint(logged) != fmt.Sprint(want) {
		t.Errorf("access log: refused heads by status %v, want %v", logged, want)
	}
}
