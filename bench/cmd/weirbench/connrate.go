package main

// The connection-rate load: each of c clients loops connect → request →
// response → close until the time is up. A request is reqSize bytes whose
// first byte says who closes first; the server answers respSize bytes and
// then either closes at once (server closes first) or waits for the
// client's FIN and closes after it (client closes first).
//
// Both ends run as subcommands of this program (`weirbench connrate`, in
// the client namespace, and `weirbench rrserver`, in the server
// namespace): separate processes whose goroutines all live in their
// namespace, so no dial pays for a thread switch into it.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"sync"
	"time"
)

const (
	reqSize  = 64
	respSize = 64

	closeClient = 'C' // the client closes first
	closeServer = 'S' // the server closes first
)

// connRateOptions describe one connection-rate run.
type connRateOptions struct {
	Addr        string        // server (or VIP) host:port
	Clients     int           // concurrency; 0 means 1
	Duration    time.Duration // how long new connections are started
	ServerClose bool          // the server closes first
	Timeout     time.Duration // per connection; 0 means 2 s
}

// connRateResult is what a connection-rate run measured. Latencies are in
// microseconds.
type connRateResult struct {
	Conns      int     `json:"conns"`  // completed without error
	Errors     int     `json:"errors"` // failed connections
	ElapsedSec float64 `json:"elapsed_sec"`
	PerSec     float64 `json:"per_sec"` // Conns / ElapsedSec
	ConnectP50 float64 `json:"connect_p50_us"`
	ConnectP99 float64 `json:"connect_p99_us"`
	TxnP50     float64 `json:"txn_p50_us"` // request written → response read
	TxnP99     float64 `json:"txn_p99_us"`
	// ErrorTexts are up to 5 distinct errors, for the report.
	ErrorTexts []string `json:"error_texts,omitempty"`
}

// runConnRate drives the load; it returns when Duration has passed (plus
// at most one Timeout for the connections in flight) or ctx ends.
func runConnRate(ctx context.Context, o connRateOptions) connRateResult {
	clients := max(o.Clients, 1)
	timeout := o.Timeout
	if timeout <= 0 {
		timeout = 2 * time.Second
	}
	mode := byte(closeClient)
	if o.ServerClose {
		mode = closeServer
	}
	req := make([]byte, reqSize)
	for i := range req {
		req[i] = 'q'
	}
	req[0] = mode

	type worker struct {
		connect, txn []time.Duration
		errs         int
		texts        []string
	}
	ws := make([]worker, clients)
	deadline := time.Now().Add(o.Duration)
	start := time.Now()
	var wg sync.WaitGroup
	for i := range ws {
		w := &ws[i]
		wg.Go(func() {
			buf := make([]byte, respSize+1)
			d := net.Dialer{Timeout: timeout}
			for ctx.Err() == nil && time.Now().Before(deadline) {
				c, txn, err := oneConn(ctx, &d, o.Addr, req, buf, timeout, o.ServerClose)
				if err != nil {
					w.errs++
					if len(w.texts) < 5 && !slices.Contains(w.texts, err.Error()) {
						w.texts = append(w.texts, err.Error())
					}
					continue
				}
				w.connect = append(w.connect, c)
				w.txn = append(w.txn, txn)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)

	var connect, txn []time.Duration
	var r connRateResult
	for _, w := range ws {
		connect = append(connect, w.connect...)
		txn = append(txn, w.txn...)
		r.Errors += w.errs
		for _, t := range w.texts {
			if len(r.ErrorTexts) < 5 && !slices.Contains(r.ErrorTexts, t) {
				r.ErrorTexts = append(r.ErrorTexts, t)
			}
		}
	}
	r.Conns = len(connect)
	r.ElapsedSec = elapsed.Seconds()
	if r.ElapsedSec > 0 {
		r.PerSec = float64(r.Conns) / r.ElapsedSec
	}
	r.ConnectP50, r.ConnectP99 = micros(percentile(connect, 50)), micros(percentile(connect, 99))
	r.TxnP50, r.TxnP99 = micros(percentile(txn, 50)), micros(percentile(txn, 99))
	return r
}

// oneConn makes one connection and returns its connect and transaction
// times. With serverClose the server's FIN must follow the response (a
// reset or more data is an error); otherwise the client closes after the
// response.
func oneConn(ctx context.Context, d *net.Dialer, addr string, req, buf []byte, timeout time.Duration, serverClose bool) (connect, txn time.Duration, err error) {
	t0 := time.Now()
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return 0, 0, fmt.Errorf("connect: %w", err)
	}
	defer c.Close()
	t1 := time.Now()
	c.SetDeadline(t0.Add(timeout))
	if _, err := c.Write(req); err != nil {
		return 0, 0, fmt.Errorf("request: %w", err)
	}
	if _, err := io.ReadFull(c, buf[:respSize]); err != nil {
		return 0, 0, fmt.Errorf("response: %w", err)
	}
	t2 := time.Now()
	if serverClose {
		n, err := c.Read(buf)
		switch {
		case n > 0:
			return 0, 0, errors.New("server close: data after the response")
		case !errors.Is(err, io.EOF):
			return 0, 0, fmt.Errorf("server close: want EOF after the response: %w", err)
		}
	}
	return t1.Sub(t0), t2.Sub(t1), nil
}

// percentile is the p-th percentile (nearest rank) of ds; it sorts ds.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	i := int(float64(len(ds))*p/100+0.5) - 1
	return ds[min(max(i, 0), len(ds)-1)]
}

func micros(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }

// serveRR answers connection-rate requests on ln until it is closed.
func serveRR(ln net.Listener) error {
	resp := make([]byte, respSize)
	for i := range resp {
		resp[i] = 'r'
	}
	for {
		c, err := ln.Accept()
		if err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				continue
			}
			return err
		}
		go rrConn(c, resp)
	}
}

// rrConn serves one connection: read the request, answer, close as the
// request's first byte says. A connection that stalls is dropped after 10 s.
func rrConn(c net.Conn, resp []byte) {
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	req := make([]byte, reqSize)
	if _, err := io.ReadFull(c, req); err != nil {
		return
	}
	if _, err := c.Write(resp); err != nil {
		return
	}
	if req[0] == closeNever {
		// Held idle (the idle measurement) until the client closes.
		c.SetDeadline(time.Time{})
		io.Copy(io.Discard, c)
		return
	}
	if req[0] == closeClient {
		// Wait for the client's FIN so that the client closes first.
		io.Copy(io.Discard, c)
	}
}

// connRateMain is `weirbench connrate`: one run, its result as JSON on
// stdout.
func connRateMain(args []string) error {
	fs := newFlagSet("connrate")
	var o connRateOptions
	fs.StringVar(&o.Addr, "addr", "", "server host:port")
	fs.IntVar(&o.Clients, "c", 1, "concurrent clients")
	fs.DurationVar(&o.Duration, "d", 5*time.Second, "how long to start new connections")
	fs.BoolVar(&o.ServerClose, "server-close", false, "the server closes first")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if o.Addr == "" || o.Duration <= 0 || o.Duration > time.Hour {
		return errors.New("connrate: need -addr and 0 < -d <= 1h")
	}
	ctx, stop := signalContext()
	defer stop()
	return json.NewEncoder(os.Stdout).Encode(runConnRate(ctx, o))
}

// rrServerMain is `weirbench rrserver`: the connection-rate server, until
// killed.
func rrServerMain(args []string) error {
	fs := newFlagSet("rrserver")
	addr := fs.String("listen", ":7000", "listen address")
	if err := fs.Parse(args); err != nil {
		return err
	}
	lc := net.ListenConfig{}
	ln, err := lc.Listen(context.Background(), "tcp", *addr)
	if err != nil {
		return err
	}
	fmt.Println("listening", ln.Addr())
	ctx, stop := signalContext()
	defer stop()
	go func() { <-ctx.Done(); ln.Close() }()
	if err := serveRR(ln); ctx.Err() == nil {
		return err
	}
	return nil
}
