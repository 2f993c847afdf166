package http

// A client's fault is never the target's
//
// An http request's first-byte timeout (timeouts.firstByte) counts from
// the end of the request as sent to the target, head and body: a target
// is silent only once it has the whole request. Until then the bounds are
// the client's: each read of the body waits at most the idle timeout for
// the client, and each write to the target at most the first-byte timeout
// (or the idle one) after it.
//
//	body read from the client ──► written to the target
//	    read fails: malformed (chunked), cut short, reset ──► 400, close
//	    read waits past the idle timeout                  ──► 408, close
//	        (ClientFailed: the target is not marked down, its
//	        connection is closed, the request alone ends)
//	    write fails (the target reset, or took nothing)  ──► the clock starts:
//	        the target may still answer (a 413 before the body is in)
//	body written ──► firstByteClock.start: the read deadline for the head
//	                 is now + firstByte ──► silent: 503, TargetFailed
//	                 ──► but bytes of the request still unacknowledged
//	                     (Target.Unacked): never with the target whole,
//	                     lost on the way (or a stalled sender: see
//	                     third_party/README.md): 502,
//	                     Undelivered, the target stays up
//
// The target's failures after its dial: a reset or close before the
// response head is a 502; after the head, the client's connection is
// reset so that a cut response is never mistaken for a whole one (a body
// ended by the close would be). Both are BadGateway, counted in
// weir_http_bad_gateway_total; neither marks the target down (a reset is
// what a pooled connection's target does at its keep-alive timeout).

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"weir/netstack/proxy"
)

// clientBody is a request body as read from the client for the target:
// each read renews the client's read deadline (idle) and the target leg's
// write deadline (write), and the first read error is kept: it is the
// client's fault, not the target's.
type clientBody struct {
	io.ReadCloser
	client      net.Conn
	leg         net.Conn
	idle, write time.Duration
	err         atomic.Pointer[error] // the first read error but EOF
}

func (b *clientBody) Read(p []byte) (int, error) {
	_ = b.client.SetReadDeadline(time.Now().Add(b.idle))
	n, err := b.ReadCloser.Read(p)
	_ = b.leg.SetWriteDeadline(time.Now().Add(b.write))
	if err != nil && err != io.EOF {
		b.err.CompareAndSwap(nil, &err)
	}
	return n, err
}

// fault returns the client's error, nil if its body read cleanly so far.
func (b *clientBody) fault() error {
	if b == nil {
		return nil
	}
	if p := b.err.Load(); p != nil {
		return *p
	}
	return nil
}

// clientBodyError is a request that failed on its client's body.
type clientBodyError struct {
	status int // 400 or 408
	err    error
}

func (e *clientBodyError) Error() string {
	return fmt.Sprintf("netstack: request body from the client failed (%d): %v", e.status, e.err)
}

func (e *clientBodyError) Unwrap() error { return e.err }

// bodyFault classifies the client's body error: 408 when the client was
// too slow, 400 otherwise (a malformed chunked body, a body cut short).
func bodyFault(err error) *clientBodyError {
	if isTimeout(err) {
		return &clientBodyError{status: http.StatusRequestTimeout, err: err}
	}
	return &clientBodyError{status: http.StatusBadRequest, err: err}
}

// firstByteClock starts the wait for the response head when the whole
// request is with the target, or ends it at once when the client failed
// its body. Its methods may be called from the body writer and the
// exchange's goroutine.
type firstByteClock struct {
	leg  net.Conn
	wait time.Duration
	mu   sync.Mutex
	head bool // the response head was read: the clock is off
}

// start sets the head's read deadline to now plus the first-byte wait.
func (c *firstByteClock) start() { c.set(time.Now().Add(c.wait)) }

// stop ends the wait for the head at once (the client failed its body).
func (c *firstByteClock) stop() { c.set(time.Unix(1, 0)) }

func (c *firstByteClock) set(t time.Time) {
	c.mu.Lock()
	if !c.head {
		_ = c.leg.SetReadDeadline(t)
	}
	c.mu.Unlock()
}

// headRead turns the clock off: the response's own reads set their
// deadlines from here.
func (c *firstByteClock) headRead() {
	c.mu.Lock()
	c.head = true
	c.mu.Unlock()
}

// writeStatus answers the client with a short plain response of its own
// and Connection: close; it reports whether it was sent.
func (hc *httpConn) writeStatus(status int) bool {
	text := http.StatusText(status)
	body := fmt.Sprintf("%d %s\n", status, text)
	_ = hc.client.SetWriteDeadline(time.Now().Add(hc.t.RequestRead))
	fmt.Fprintf(hc.bw, "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", status, text, len(body), body)
	return hc.bw.Flush() == nil
}

// clientFailed answers a request whose client failed its body (400 or
// 408) and counts it; the target's connection is closed already.
func (hc *httpConn) clientFailed(cbe *clientBodyError, re *proxy.RequestEnd) (bool, proxy.Outcome, error) {
	if cbe.status == http.StatusRequestTimeout {
		hc.f.httpBodyTimedOut.Add(1)
	} else {
		hc.f.httpBadRequest.Add(1)
	}
	before := hc.cw.n
	if re.ResponseBytes == 0 && hc.writeStatus(cbe.status) {
		re.Status = cbe.status
	}
	re.ResponseBytes += hc.cw.n - before
	return false, proxy.ClientFailed, cbe
}

// targetCut handles a response the target failed in its body (bj.rerr):
// nothing of it reached the client yet (before is the client count when
// it began) and the head still waits in the buffer: a 502 replaces it;
// else the client's connection is reset, so the cut is seen. It reports
// the status the client got.
func (hc *httpConn) targetCut(before int64, status int) int {
	if hc.cw.n == before {
		hc.bw.Reset(&hc.cw)
		if hc.writeStatus(http.StatusBadGateway) {
			return http.StatusBadGateway
		}
		return 0
	}
	hc.client.Reset()
	return status
}
