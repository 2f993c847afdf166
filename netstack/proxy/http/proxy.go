package http

// HTTP request flow (virtual servers with protocol http, when the proxy's
// Options.HTTP is a Server)
//
//	client established ──► AdmitClient (the service's client-connection
//	    bound, apart from the request limits) ──► refused: 503 page, close
//	loop, one request at a time:
//	    wait for the first byte (KeepAliveIdle; no request slot held)
//	    read the head (HeaderTimeout, MaxHeaderBytes)
//	          too slow ──► 408, close           HTTPHeaderTimedOut  BadRequest
//	          too big  ──► 431, close           HTTPHeaderTooLarge  BadRequest
//	          malformed, or Content-Length with Transfer-Encoding
//	                   ──► 400, close           HTTPBadRequest      BadRequest
//	    AdmitRequest ──► (Decision, Session): the request counts from here
//	          refused ──► 503 page naming the limit, on this connection,
//	                      which stays open (the request's body is read and
//	                      dropped, up to proxy.DrainLimit)   End(RefusedPage)
//	          Accept ──► pooled target connection or a dial (DialFailed as
//	                      for a splice) ──► request written (hop-by-hop
//	                      headers dropped, X-Forwarded-For / Forwarded added,
//	                      the body streamed, chunked too) ──► response
//	                      (1xx relayed, Expect: 100-continue answered by
//	                      the target) ──► written to the client
//	                                                   End(Served)
//	          a pooled connection the target had closed: an idempotent
//	          request without a body is sent once more on a fresh one
//	    Released comes when the whole response is buffered for the client,
//	    before its last bytes are sent (End with the counts right after):
//	    a client that sends its next request, or reconnects, finds the
//	    slot free.
//	connection done ──► the client slot is released, then weir's FIN
//
// Bytes per request. The datapath meters a client connection as a whole;
// the bandwidth limits count requests: each request that reaches a target
// reports its own bytes on the client connection to its RequestSession
// (Moved) as they move: its head once the target connection is ready, its
// body as the body writer reads it, its response as it goes into the
// client writer's buffer. The bytes between two reports are what was
// consumed from the client reader (read from the socket less what is still
// buffered) and what was written for the request; a refused request's head
// and body are skipped, and weir's own pages (503, 502) are written with no
// request to report to.
//
// Parsing is net/http's (http.ReadRequest, http.ReadResponse on bufio
// readers; Request.Write, Response.Write stream the bodies). What net/http
// does not do for a proxy is here: the head's size and time bounds checked on
// the buffered bytes before ReadRequest sees them (so the request line is
// known for the 408/431 line too), the smuggling check on the raw head
// (Go drops a Content-Length that comes with chunked instead of refusing),
// hop-by-hop headers, and HTTP/1.0 keep-alive.

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"weir/netstack/proxy"
	"weir/policy"
)

var (
	ErrHeaderTimeout  = errors.New("netstack: request head not received within the header timeout")
	ErrHeaderTooLarge = errors.New("netstack: request head larger than maxHeaderBytes")
	ErrSmuggling      = errors.New("netstack: request has both Content-Length and Transfer-Encoding")
)

// Options configure a Server.
type Options struct {
	// RequestAdmitter admits the client connections and requests; nil
	// refuses every client connection with RST.
	RequestAdmitter proxy.RequestAdmitter
}

// Stats are a Server's counters: totals since New, but the gauges
// (Clients, TargetConns, TargetConnsIdle). The connections it admits,
// refuses and dials count in its proxy's Stats too.
type Stats struct {
	Requests      uint64 // requests whose head was parsed
	Refused       uint64 // of those, answered with the 503 page (also in the proxy's Refused503)
	HeaderTimeout uint64 // request heads not complete within HeaderTimeout (408)
	HeaderTooBig  uint64 // request heads over MaxHeaderBytes (431)
	BadRequest    uint64 // malformed heads, Content-Length with Transfer-Encoding, bodies the client malformed or cut short (400)
	Retried       uint64 // idempotent requests sent again on a fresh target connection after a pooled one failed
	BadGateway    uint64 // requests whose target failed mid-exchange (502, or a cut response)
	BodyTimeout   uint64 // admitted requests whose client stalled its body past the idle timeout (408)
	// Undelivered: of BadGateway, requests the target had not acknowledged
	// whole when firstByte ran out (the target is not marked down).
	Undelivered uint64
	Clients     int64 // client connections open now
	TargetConns int64 // target connections open now (in use or pooled)
	// TargetConnsIdle: of those, idle in the pool.
	TargetConnsIdle int
}

// Server is the request-by-request proxy of http virtual servers: a
// proxy.RequestServer (give it to proxy.Options.HTTP). Make one with New.
type Server struct {
	ra proxy.RequestAdmitter

	pool                                                                   pool
	requests, requestsRefused, httpRetried                                 atomic.Uint64
	httpHeaderTimedOut, httpHeaderTooLarge, httpBadRequest, httpBadGateway atomic.Uint64
	httpBodyTimedOut, httpUndelivered                                      atomic.Uint64
	httpClients, backends                                                  atomic.Int64
}

var _ proxy.RequestServer = (*Server)(nil)

// New returns a Server.
func New(opts Options) *Server { return &Server{ra: opts.RequestAdmitter} }

// Stats returns the server's counters.
func (s *Server) Stats() Stats {
	return Stats{
		Requests: s.requests.Load(), Refused: s.requestsRefused.Load(), HeaderTimeout: s.httpHeaderTimedOut.Load(),
		HeaderTooBig: s.httpHeaderTooLarge.Load(), BadRequest: s.httpBadRequest.Load(), Retried: s.httpRetried.Load(),
		BadGateway: s.httpBadGateway.Load(), BodyTimeout: s.httpBodyTimedOut.Load(), Undelivered: s.httpUndelivered.Load(), Clients: s.httpClients.Load(),
		TargetConns: s.backends.Load(), TargetConnsIdle: s.pool.idleCount(),
	}
}

// Close implements proxy.RequestServer: it closes the idle target
// connections; later puts close theirs.
func (s *Server) Close() { s.pool.closeAll(s) }

// httpConn is one client connection of an http virtual server.
type httpConn struct {
	f      *Server
	p      *proxy.Proxy
	c      *proxy.Counters // p's
	req    *proxy.ConnRequest
	ha     proxy.RequestAdmitter
	client proxy.Client
	br     *bufio.Reader
	bw     *bufio.Writer
	cw     countWriter // under bw: counts the bytes written to the client
	cr     countReader // under br: counts the bytes read from the client
	t      policy.Timeouts
	o      policy.HTTPOptions
	seq    int
	// own are the pool keys of the target connections this client put in
	// the pool that no other client can use (a PROXY-protocol target's,
	// keyed by the client): closed with the client connection.
	own []poolKey

	// Per-request bytes (see the file comment). sink is the request whose
	// response bytes mw reports, nil between requests and while weir
	// writes a page of its own (the connection's goroutine only); mw is bw
	// with that report, mr the reader mw.ReadFrom wraps.
	sink proxy.RequestSession
	mw   meteredWriter
	mr   meteredReader
	pend int64 // response bytes written for sink, not reported yet
	// inDone is the client bytes consumed from br already accounted for
	// (reported or skipped), segDone the client connection's segments;
	// both change from the body writer too. hdr is the TCP/IP header
	// bytes counted per segment for Moved's wire count.
	inDone  atomic.Int64
	segDone atomic.Uint64
	hdr     int64
}

// ServeClient implements proxy.RequestServer: it runs an http client
// connection in the proxy's goroutine for it.
func (f *Server) ServeClient(p *proxy.Proxy, req *proxy.ConnRequest, client proxy.Client, pendingDone func()) {
	t := req.Service.Timeouts
	o := req.Service.HTTP
	c := p.Counters()
	ha := f.ra
	if ha == nil {
		pendingDone()
		c.RefusedRST.Add(1)
		client.Reset()
		return
	}
	d, release := ha.AdmitClient(req)
	pendingDone()
	if d.Verdict != proxy.Accept {
		if d.Verdict == proxy.Refuse503 {
			c.Refused503.Add(1)
			proxy.Serve503(client, proxy.PageOf(d), t.RequestRead)
		} else {
			c.RefusedRST.Add(1)
			client.Reset()
		}
		if release != nil {
			release()
		}
		return
	}
	c.Accepted.Add(1) // for an http service: client connections admitted
	f.httpClients.Add(1)
	defer f.httpClients.Add(-1)
	hc := &httpConn{f: f, p: p, c: c, req: req, ha: ha, client: client, t: t, o: o}
	hc.cw.w, hc.cr.r = client, client
	// The reader's buffer holds a whole head: the bounds are checked on
	// it before net/http parses it.
	hc.br = bufio.NewReaderSize(&hc.cr, o.MaxHeaderBytes+1)
	hc.bw = bufio.NewWriterSize(&hc.cw, 16<<10)
	hc.mw.hc, hc.mr.hc = hc, hc
	hc.hdr = 40 + 32 // IPv6 and TCP with timestamps
	if req.Conn().Addr().Unmap().Is4() {
		hc.hdr = 20 + 32
	}
	hc.skipSegs() // the handshake is no request's
	defer p.Hold(client)()
	for hc.one() {
	}
	for _, k := range hc.own {
		f.pool.drop(f, k)
	}
	// The client's slot goes back before weir's FIN, as a tcp
	// connection's does (proxy/release.go).
	if release != nil {
		release()
	}
	_ = client.CloseWrite()
	_ = client.SetReadDeadline(time.Now().Add(t.RequestRead))
	_, _ = io.CopyN(io.Discard, hc.br, proxy.DrainLimit)
	client.Close()
}

// one serves one request; it reports whether the connection stays open for
// another.
func (hc *httpConn) one() bool {
	f := hc.f
	if hc.p.Stopping() {
		return false
	}
	// Idle: no request slot is held while waiting.
	_ = hc.client.SetReadDeadline(time.Now().Add(hc.o.KeepAliveIdle))
	if _, err := hc.br.Peek(1); err != nil {
		return false
	}
	start := time.Now()
	hc.seq++
	hc.skipBytes() // what the last request left unreported is no one's
	_ = hc.client.SetReadDeadline(start.Add(hc.o.HeaderTimeout))
	head, herr := hc.peekHead()
	if herr != nil {
		status := http.StatusBadRequest
		switch {
		case errors.Is(herr, ErrHeaderTooLarge):
			status = http.StatusRequestHeaderFieldsTooLarge
			f.httpHeaderTooLarge.Add(1)
		case isTimeout(herr):
			status = http.StatusRequestTimeout
			f.httpHeaderTimedOut.Add(1)
		default:
			if hc.br.Buffered() == 0 {
				return false // the client closed before a whole head
			}
			f.httpBadRequest.Add(1)
		}
		hc.badRequest(proxy.RequestLine(head), status, start)
		return false
	}
	line := proxy.RequestLine(head)
	if conflictingLength(head) {
		f.httpBadRequest.Add(1)
		hc.badRequest(line, http.StatusBadRequest, start)
		return false
	}
	in, err := http.ReadRequest(hc.br)
	if err != nil {
		f.httpBadRequest.Add(1)
		hc.badRequest(line, http.StatusBadRequest, start)
		return false
	}
	if status := proxy.Unservable(in, head); status != 0 {
		f.httpBadRequest.Add(1)
		hc.badRequest(line, status, start)
		return false
	}
	_ = hc.client.SetReadDeadline(time.Time{})
	r := &proxy.Request{Seq: hc.seq, Method: in.Method, Line: line, Host: in.Host, Header: in.Header, Start: time.Now()}
	f.requests.Add(1)
	return hc.route(in, r)
}

// peekHead waits until the buffer holds a whole request head (up to the
// blank line) and returns it, unconsumed. A head that does not fit
// MaxHeaderBytes is ErrHeaderTooLarge; a deadline is a timeout error.
func (hc *httpConn) peekHead() ([]byte, error) {
	limit := hc.o.MaxHeaderBytes
	from := 0
	for {
		n := hc.br.Buffered()
		b, _ := hc.br.Peek(n)
		if i := headEnd(b, from); i >= 0 {
			return b[:i], nil
		}
		if n >= limit {
			return b, ErrHeaderTooLarge
		}
		from = max(0, n-3)
		if _, err := hc.br.Peek(n + 1); err != nil {
			b, _ := hc.br.Peek(hc.br.Buffered())
			return b, err
		}
	}
}

// headEnd returns the length of the head in b (through its blank line), or
// -1; it searches from from.
func headEnd(b []byte, from int) int {
	for i := from; i < len(b); i++ {
		if b[i] != '\n' {
			continue
		}
		if i+1 < len(b) && b[i+1] == '\n' {
			return i + 2
		}
		if i+2 < len(b) && b[i+1] == '\r' && b[i+2] == '\n' {
			return i + 3
		}
	}
	return -1
}

// conflictingLength reports a head with both Content-Length and
// Transfer-Encoding: the two framings a front and a back end may read
// differently (request smuggling, RFC 9112 §6.1). net/http would quietly
// prefer chunked.
func conflictingLength(head []byte) bool {
	var cl, te bool
	for _, l := range bytes.Split(head, []byte("\n")) {
		i := bytes.IndexByte(l, ':')
		if i <= 0 {
			continue
		}
		name := string(bytes.TrimSpace(l[:i]))
		cl = cl || strings.EqualFold(name, "Content-Length")
		te = te || strings.EqualFold(name, "Transfer-Encoding")
	}
	return cl && te
}

// badRequest answers a request refused before admission and closes.
func (hc *httpConn) badRequest(line string, status int, start time.Time) {
	text := http.StatusText(status)
	body := strconv.Itoa(status) + " " + text + "\n"
	before := hc.cw.n
	_ = hc.client.SetWriteDeadline(time.Now().Add(hc.t.RequestRead))
	fmt.Fprintf(hc.bw, "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", status, text, len(body), body)
	sent := status
	if hc.bw.Flush() != nil {
		sent = 0
	}
	hc.ha.BadRequest(hc.req, &proxy.RequestEnd{Seq: hc.seq, Line: line, Status: sent, ResponseBytes: hc.cw.n - before, Start: start, Duration: time.Since(start)})
}

// route admits a parsed request and serves it; it reports whether the
// connection stays open.
func (hc *httpConn) route(in *http.Request, r *proxy.Request) (keep bool) {
	f := hc.f
	clientWantsClose := in.Close || (in.ProtoMajor == 1 && in.ProtoMinor == 0 && !hasToken(in.Header, "Connection", "keep-alive"))
	var (
		d    proxy.Decision
		sess proxy.RequestSession
	)
	re := &proxy.RequestEnd{Seq: r.Seq, Line: r.Line, Start: r.Start}
	end := proxy.End{Request: re, Stats: proxy.ConnStats{ID: hc.req.ID, Client: hc.req.Client, VIP: hc.req.VIP, Service: hc.req.Service.Name, Start: r.Start}}
	ended := false
	report := func(o proxy.Outcome, err error) {
		if sess == nil || ended {
			return
		}
		ended = true
		re.Duration = time.Since(r.Start)
		end.Outcome, end.Decision, end.Err, end.Dials = o, d, err, hc.req.Attempt
		end.Stats.Target = proxy.TargetName(d)
		end.Stats.TargetLeg.BytesSent = uint64(re.RequestBytes)
		end.Stats.ClientLeg.BytesSent = uint64(re.ResponseBytes)
		sess.End(&end)
	}
	defer func() {
		if v := recover(); v != nil {
			func() {
				defer func() { _ = recover() }()
				report(proxy.Panicked, fmt.Errorf("panic: %v", v))
			}()
			panic(v)
		}
	}()
	hc.req.Attempt = 0
	d, sess = hc.ha.AdmitRequest(hc.req, r)
	if d.Verdict == proxy.Accept && sess == nil {
		hc.c.NoSession.Add(1)
		d = proxy.Decision{Verdict: proxy.Refuse503, Reason: "accepted without a session"}
	}
	if d.Verdict != proxy.Accept {
		hc.c.Refused503.Add(1)
		f.requestsRefused.Add(1)
		keep = !clientWantsClose && hc.dropBody(in)
		before := hc.cw.n
		_ = hc.client.SetWriteDeadline(time.Now().Add(hc.t.RequestRead))
		_, err := hc.bw.Write(proxy.PageOf(d).Render(hc.connField(in, keep)))
		if err == nil {
			err = hc.bw.Flush()
		}
		_ = hc.client.SetWriteDeadline(time.Time{})
		hc.skipSegs()
		re.ResponseBytes = hc.cw.n - before
		if err == nil {
			re.Status = http.StatusServiceUnavailable
		}
		end.Refusal = proxy.Refusal{Status: re.Status, RequestLine: r.Line, Bytes: int(re.ResponseBytes)}
		report(proxy.RefusedPage, nil)
		return keep && err == nil
	}
	keep, outcome, err := hc.exchange(in, &d, sess, re, clientWantsClose)
	hc.endSink()
	report(outcome, err)
	return keep
}

// connField is the Connection field of a response weir writes itself:
// close, or for an HTTP/1.0 keep-alive client keep-alive.
func (hc *httpConn) connField(in *http.Request, keep bool) string {
	switch {
	case !keep:
		return "close"
	case in.ProtoMajor == 1 && in.ProtoMinor == 0:
		return "keep-alive"
	}
	return ""
}

// dropBody reads and discards a refused request's body, up to proxy.DrainLimit;
// it reports whether the connection can carry another request.
func (hc *httpConn) dropBody(in *http.Request) bool {
	if in.Body == nil || in.Body == http.NoBody {
		return true
	}
	_ = hc.client.SetReadDeadline(time.Now().Add(hc.t.RequestRead))
	defer hc.client.SetReadDeadline(time.Time{})
	n, err := io.CopyN(io.Discard, in.Body, proxy.DrainLimit+1)
	return n <= proxy.DrainLimit && errors.Is(err, io.EOF)
}

// exchange sends an admitted request to its target and its response to the
// client. It returns whether the client connection stays open, the outcome
// and its error.
func (hc *httpConn) exchange(in *http.Request, d *proxy.Decision, sess proxy.RequestSession, re *proxy.RequestEnd, clientWantsClose bool) (bool, proxy.Outcome, error) {
	f := hc.f
	if in.Body != nil && in.Body != http.NoBody {
		in.Body = &meteredBody{ReadCloser: in.Body, hc: hc, s: sess}
	}
	out := hc.outbound(in)
	idempotent := out.Body == nil || out.Body == http.NoBody
	switch in.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace, http.MethodPut, http.MethodDelete:
	default:
		idempotent = false
	}
	var (
		bc   *backendConn
		resp *http.Response
		err  error
	)
	for attempt := 0; ; attempt++ {
		bc, err = hc.backend(d, sess, attempt > 0)
		if err != nil {
			if hc.p.Closed() {
				hc.c.Aborted.Add(1)
				return false, proxy.Aborted, err
			}
			// Every target failed: the Session refused.
			hc.c.Refused503.Add(1)
			f.requestsRefused.Add(1)
			hc.endSink()
			if mb, ok := in.Body.(*meteredBody); ok {
				in.Body = mb.ReadCloser // dropped, not reported
			}
			keep := !clientWantsClose && hc.dropBody(in)
			before := hc.cw.n
			if _, werr := hc.bw.Write(proxy.PageOf(*d).Render(hc.connField(in, keep))); werr == nil && hc.bw.Flush() == nil {
				re.Status = http.StatusServiceUnavailable
			} else {
				keep = false
			}
			hc.skipSegs()
			re.ResponseBytes = hc.cw.n - before
			return keep, proxy.RefusedPage, nil
		}
		// A target connection is ready: from here on the request's bytes
		// count, its head first.
		hc.sink = sess
		hc.reportIn(sess)
		re.Reused = bc.uses > 0
		resp, err = hc.roundTrip(bc, out, re)
		if err == nil {
			break
		}
		reused := bc.uses > 0
		var unacked uint64
		if errors.Is(err, proxy.ErrFirstByteTimeout) {
			unacked = bc.t.Unacked() // before the close ends the flow
		}
		f.closeBackend(bc)
		if cbe := (*clientBodyError)(nil); errors.As(err, &cbe) {
			return hc.clientFailed(cbe, re)
		}
		if reused && idempotent && attempt == 0 && !errors.Is(err, proxy.ErrFirstByteTimeout) {
			// The target closed the pooled connection: once more on a
			// fresh one.
			f.httpRetried.Add(1)
			re.Retried = true
			continue
		}
		if errors.Is(err, proxy.ErrFirstByteTimeout) && unacked > 0 {
			// The target never acknowledged the whole request: its
			// silence is not the target's (the path lost the tail, or
			// a sender stalled on it; see body.go). A 502 below, and
			// the target stays up.
			f.httpUndelivered.Add(1)
			err = fmt.Errorf("the target did not acknowledge the whole request (%d bytes unacknowledged at firstByte): %w", unacked, err)
		} else if errors.Is(err, proxy.ErrFirstByteTimeout) {
			hc.c.TargetTimedOut.Add(1)
			sess.TargetFailed(*d, err)
			fd := *d
			fd.Verdict, fd.Limit, fd.Value, fd.Reason = proxy.Refuse503, "firstByte", 0, "the target sent no response in time"
			hc.endSink()
			before := hc.cw.n
			if _, werr := hc.bw.Write(proxy.PageOf(fd).Render("close")); werr == nil && hc.bw.Flush() == nil {
				re.Status = http.StatusServiceUnavailable
			}
			re.ResponseBytes = hc.cw.n - before
			return false, proxy.TargetTimedOut, err
		}
		// The target failed mid-request: nothing sane can follow on this
		// connection.
		hc.endSink()
		before := hc.cw.n
		if re.ResponseBytes == 0 {
			body := "502 Bad Gateway\n"
			fmt.Fprintf(hc.bw, "HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(body), body)
			if hc.bw.Flush() == nil {
				re.Status = http.StatusBadGateway
			}
			re.ResponseBytes = hc.cw.n - before
		}
		f.httpBadGateway.Add(1)
		return false, proxy.BadGateway, err
	}
	bc.uses++
	keep, backendOK := hc.respond(in, resp, re, clientWantsClose, sess)
	if backendOK && !resp.Close && !hc.p.Stopping() {
		bc.t.Park()
		if bc.key.client.IsValid() && !slices.Contains(hc.own, bc.key) {
			hc.own = append(hc.own, bc.key)
		}
		f.pool.put(f, bc, hc.o.MaxIdlePerTarget, hc.o.BackendIdle)
	} else {
		f.closeBackend(bc)
	}
	if rerr := resp.Body.(*bodyJoin).rerr; rerr != nil && !backendOK {
		// The target failed in its response body.
		f.httpBadGateway.Add(1)
		return false, proxy.BadGateway, rerr
	}
	return keep, proxy.Served, nil
}

// backend returns a connection to d's target: a pooled one unless fresh,
// else a dial; a failed dial asks the Session for another target, as for a
// splice.
func (hc *httpConn) backend(d *proxy.Decision, sess proxy.RequestSession, fresh bool) (*backendConn, error) {
	f := hc.f
	for d.Verdict == proxy.Accept {
		if d.Target == nil {
			return nil, errors.New("netstack: accept decision without a target")
		}
		k := poolKey{service: hc.req.Service.Name, target: proxy.TargetName(*d), via: d.Target.Via, addr: d.Target.Addr.String()}
		if d.Target.ProxyProtocol != policy.ProxyNone {
			// The connection's header names this client: no other may
			// reuse it (see pool.go).
			k.client, k.vip = hc.req.Client, hc.req.VIP
		}
		if !fresh && d.Dialer == nil {
			if bc := f.pool.get(f, k, hc.o.BackendIdle); bc != nil {
				// From now on its activity is this request's (its action).
				bc.t.Lend(hc.req, *d)
				return bc, nil
			}
		}
		bc, err := f.dialBackend(hc.p, hc.req, *d, hc.client, k, hc.t.Connect)
		if err == nil {
			return bc, nil
		}
		if hc.p.Closed() {
			return nil, err
		}
		hc.c.DialFailed.Add(1)
		hc.req.Attempt++
		*d = sess.DialFailed(*d, err)
	}
	return nil, errors.New("netstack: no target could be dialed")
}

// outbound builds the request sent to the target: hop-by-hop fields
// removed, the client named in X-Forwarded-For or Forwarded.
func (hc *httpConn) outbound(in *http.Request) *http.Request {
	out := new(http.Request)
	*out = *in
	out.Header = in.Header.Clone()
	removeHopByHop(out.Header)
	out.Close = false
	out.Proto, out.ProtoMajor, out.ProtoMinor = "HTTP/1.1", 1, 1
	if _, ok := out.Header["User-Agent"]; !ok {
		// Request.Write adds Go's own when there is none.
		out.Header["User-Agent"] = []string{""}
	}
	client := hc.req.Client.Addr().Unmap().String()
	mode := hc.o.Forwarded
	if mode == policy.ForwardXFF || mode == policy.ForwardBoth {
		if prior := out.Header.Values("X-Forwarded-For"); len(prior) > 0 {
			out.Header.Set("X-Forwarded-For", strings.Join(prior, ", ")+", "+client)
		} else {
			out.Header.Set("X-Forwarded-For", client)
		}
	}
	if mode == policy.ForwardRFC7239 || mode == policy.ForwardBoth {
		node := client
		if hc.req.Client.Addr().Unmap().Is6() {
			node = `"[` + client + `]"`
		}
		v := "for=" + node
		if prior := out.Header.Values("Forwarded"); len(prior) > 0 {
			v = strings.Join(prior, ", ") + ", " + v
		}
		out.Header.Set("Forwarded", v)
	}
	return out
}

// hopByHop are the fields that concern one connection only (RFC 9110
// §7.6.1), never forwarded.
var hopByHop = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

// removeHopByHop drops the hop-by-hop fields and those Connection names.
func removeHopByHop(h http.Header) {
	for _, v := range h.Values("Connection") {
		for _, name := range strings.Split(v, ",") {
			if name = strings.TrimSpace(name); name != "" {
				h.Del(name)
			}
		}
	}
	for _, name := range hopByHop {
		h.Del(name)
	}
}

// hasToken reports whether the comma-separated field name holds token.
func hasToken(h http.Header, name, token string) bool {
	for _, v := range h.Values(name) {
		for _, t := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}

// roundTrip writes out to bc and reads the response head, relaying 1xx
// answers (100 Continue) to the client. A request body is written by a
// goroutine of its own, so that a client waiting for 100 Continue, or a
// target that answers before the body is in, cannot stall the exchange.
func (hc *httpConn) roundTrip(bc *backendConn, out *http.Request, re *proxy.RequestEnd) (*http.Response, error) {
	before := bc.t.Sent()
	_ = bc.leg.SetWriteDeadline(time.Now().Add(hc.idle()))
	hasBody := out.Body != nil && out.Body != http.NoBody
	wait := hc.t.FirstByte
	if wait <= 0 {
		wait = hc.idle()
	}
	// The first-byte wait starts once the whole request is with the
	// target (httpbody.go).
	clock := &firstByteClock{leg: bc.leg, wait: wait}
	var bodyErr chan error
	var cb *clientBody
	if !hasBody {
		if err := out.Write(bc.bw); err != nil {
			return nil, err
		}
		if err := bc.bw.Flush(); err != nil {
			return nil, err
		}
		clock.start()
	} else {
		_ = bc.leg.SetReadDeadline(time.Time{})
		cb = &clientBody{ReadCloser: out.Body, client: hc.client, leg: bc.leg, idle: hc.idle(), write: wait}
		out.Body = cb
		bodyErr = make(chan error, 1)
		go func() {
			err := out.Write(bc.bw)
			if err == nil {
				err = bc.bw.Flush()
			}
			if cb.fault() != nil {
				clock.stop()
			} else {
				clock.start()
			}
			bodyErr <- err
		}()
	}
	for {
		resp, err := http.ReadResponse(bc.br, out)
		if err != nil {
			fault := cb.fault()
			if bodyErr != nil {
				// Unblock and wait for the body writer before the leg
				// is closed.
				_ = bc.leg.SetDeadline(time.Unix(1, 0))
				_ = hc.client.SetReadDeadline(time.Unix(1, 0))
				<-bodyErr
			}
			re.RequestBytes = int64(bc.t.Sent() - before)
			if fault != nil {
				return nil, bodyFault(fault)
			}
			if isTimeout(err) && hc.t.FirstByte > 0 {
				return nil, proxy.ErrFirstByteTimeout
			}
			return nil, err
		}
		if resp.StatusCode >= 100 && resp.StatusCode < 200 && resp.StatusCode != http.StatusSwitchingProtocols {
			// 100 Continue and the like: relay, then the real answer.
			fmt.Fprintf(hc.mw, "HTTP/1.1 %s\r\n", resp.Status)
			removeHopByHop(resp.Header)
			_ = resp.Header.Write(hc.mw)
			_, _ = io.WriteString(hc.mw, "\r\n")
			hc.flushOut()
			if err := hc.bw.Flush(); err != nil {
				if bodyErr != nil {
					_ = bc.leg.SetDeadline(time.Unix(1, 0))
					_ = hc.client.SetReadDeadline(time.Unix(1, 0))
					<-bodyErr
				}
				return nil, err
			}
			continue
		}
		clock.headRead()
		resp.Body = &bodyJoin{ReadCloser: resp.Body, bodyErr: bodyErr, bc: bc, hc: hc, re: re, before: before}
		_ = bc.leg.SetReadDeadline(time.Time{})
		return resp, nil
	}
}

// idle is the per-read and per-write bound on a request in flight.
func (hc *httpConn) idle() time.Duration {
	if hc.t.Idle > 0 {
		return hc.t.Idle
	}
	return policy.DefaultIdleTimeout
}

// bodyJoin is a response body that, once read to its end, waits for the
// request body writer (its error decides whether the target connection is
// reusable) and notes the request's size. Each read renews the target
// leg's idle deadline.
type bodyJoin struct {
	io.ReadCloser
	bodyErr chan error
	bc      *backendConn
	hc      *httpConn
	re      *proxy.RequestEnd
	before  uint64
	joined  bool
	err     error
	rerr    error // the target's error reading the body (not EOF)
}

func (b *bodyJoin) Read(p []byte) (int, error) {
	_ = b.bc.leg.SetReadDeadline(time.Now().Add(b.hc.idle()))
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.join(false)
	} else if err != nil && b.rerr == nil {
		b.rerr = err
	}
	return n, err
}

// join waits for the request body (at once when abandon: the response
// ended the exchange early) and records the request's bytes.
func (b *bodyJoin) join(abandon bool) {
	if b.joined {
		return
	}
	b.joined = true
	if b.bodyErr != nil {
		select {
		case b.err = <-b.bodyErr:
		default:
			if abandon {
				_ = b.bc.leg.SetDeadline(time.Unix(1, 0))
				_ = b.hc.client.SetReadDeadline(time.Unix(1, 0))
				b.err = errors.New("request body abandoned")
				<-b.bodyErr
			} else {
				// The response is complete but the request body is
				// still going: a target may answer first; the body
				// still has to reach it (or fail).
				t := time.NewTimer(b.hc.t.RequestRead)
				select {
				case b.err = <-b.bodyErr:
					t.Stop()
				case <-t.C:
					_ = b.bc.leg.SetDeadline(time.Unix(1, 0))
					_ = b.hc.client.SetReadDeadline(time.Unix(1, 0))
					b.err = errors.New("request body not sent in time")
					<-b.bodyErr
				}
			}
		}
	}
	b.re.RequestBytes = int64(b.bc.t.Sent() - b.before)
}

// respond writes the response to the client. It returns whether the client
// connection stays open and whether the target connection is reusable.
//
// The request's slots are released (Session.Released) once the whole response is in
// the client writer's buffer and before its last bytes go out: a client that
// sends its next request the moment it has the response, on another
// connection too, finds them free. End follows with the final counts.
func (hc *httpConn) respond(in *http.Request, resp *http.Response, re *proxy.RequestEnd, clientWantsClose bool, sess proxy.RequestSession) (keep, backendOK bool) {
	bj := resp.Body.(*bodyJoin)
	removeHopByHop(resp.Header)
	http10 := in.ProtoMajor == 1 && in.ProtoMinor == 0
	keep = !clientWantsClose && !hc.p.Stopping()
	if resp.ContentLength < 0 && len(resp.TransferEncoding) == 0 && in.Method != http.MethodHead {
		// A body the target ends by closing: so must weir.
		keep = false
	}
	if http10 {
		resp.Proto, resp.ProtoMajor, resp.ProtoMinor = "HTTP/1.0", 1, 0
		if resp.ContentLength < 0 && in.Method != http.MethodHead {
			// No chunked framing for 1.0: the close ends the body.
			resp.TransferEncoding = nil
			keep = false
		}
		if keep {
			resp.Header.Set("Connection", "keep-alive")
		}
	} else {
		resp.Proto, resp.ProtoMajor, resp.ProtoMinor = "HTTP/1.1", 1, 1
	}
	resp.Close = !keep
	before := hc.cw.n
	_ = hc.client.SetWriteDeadline(time.Now().Add(hc.idle()))
	err := resp.Write(hc.mw)
	hc.flushOut() // all of the response, before its slot goes
	if err == nil {
		sess.Released()
	}
	if err == nil {
		err = hc.bw.Flush()
	}
	if err != nil && bj.rerr != nil {
		// The target cut its response: a 502 if none of it was sent,
		// else the client's connection reset (httpbody.go).
		re.Status = hc.targetCut(before, resp.StatusCode)
	}
	_ = hc.client.SetWriteDeadline(time.Time{})
	re.ResponseBytes = hc.cw.n - before
	if err == nil {
		re.Status = resp.StatusCode
	}
	// Response.Write has read the body to its end unless something failed.
	bj.join(err != nil)
	resp.Body.Close()
	backendOK = err == nil && bj.err == nil
	if bj.err != nil {
		// The request body did not get through: the client's stream is
		// at an unknown point.
		keep = false
	}
	return keep && err == nil, backendOK
}

// countWriter counts the bytes written through it; used only from the
// connection's goroutine (and the body writer's, which never writes here).
type countWriter struct {
	w net.Conn
	n int64
}

func (c *countWriter) Write(b []byte) (int, error) {
	n, err := c.w.Write(b)
	c.n += int64(n)
	return n, err
}

// countReader counts the bytes read from the client. The connection's
// goroutine and the request body writer read through it, never at once.
type countReader struct {
	r net.Conn
	n atomic.Int64
}

func (c *countReader) Read(b []byte) (int, error) {
	n, err := c.r.Read(b)
	c.n.Add(int64(n))
	return n, err
}

// consumed is the client bytes taken out of br: read from the socket less
// those still buffered. Call it from the goroutine reading br.
func (hc *httpConn) consumed() int64 { return hc.cr.n.Load() - int64(hc.br.Buffered()) }

// skipBytes marks the client bytes consumed so far as accounted for,
// unreported: a refused request's head and body are no level's.
func (hc *httpConn) skipBytes() { hc.inDone.Store(hc.consumed()) }

// skipSegs marks the client connection's segments so far as accounted for,
// unreported (the handshake, a page of weir's own).
func (hc *httpConn) skipSegs() { hc.segDone.Store(hc.client.Segments()) }

// reportIn reports to s the client bytes consumed since the last account
// (the head, then the body as it is read). Call it from the goroutine
// reading br.
func (hc *httpConn) reportIn(s proxy.RequestSession) {
	c := hc.consumed()
	if n := c - hc.inDone.Swap(c); n > 0 {
		hc.moved(s, n)
	}
}

// moved reports n bytes to s, with the TCP/IP headers of the client
// connection's segments since the last report for the wire count.
func (hc *httpConn) moved(s proxy.RequestSession, n int64) {
	seg := hc.client.Segments()
	segs := int64(seg - hc.segDone.Swap(seg))
	s.Moved(n, n+segs*hc.hdr)
}

// meteredWriter is the client writer of a response: bw, reporting what goes
// in to the request being served (httpConn.sink), so that the whole
// response is reported before Released. It keeps bw's ReadFrom (no copy
// buffer per response).
type meteredWriter struct{ hc *httpConn }

func (w meteredWriter) Write(b []byte) (int, error) {
	n, err := w.hc.bw.Write(b)
	w.hc.wrote(n)
	return n, err
}

// WriteString keeps bw's (net/http writes header lines with it).
func (w meteredWriter) WriteString(str string) (int, error) {
	n, err := w.hc.bw.WriteString(str)
	w.hc.wrote(n)
	return n, err
}

// reportEvery is how many response bytes are gathered before a report.
const reportEvery = 16 << 10

// wrote counts n response bytes for the request being served, reporting
// them once reportEvery have gathered (flushOut reports the rest).
func (hc *httpConn) wrote(n int) {
	if hc.sink == nil || n <= 0 {
		return
	}
	if hc.pend += int64(n); hc.pend >= reportEvery {
		hc.flushOut()
	}
}

// endSink reports what the request being served has pending and stops
// reporting: its exchange is over, or weir writes a page of its own.
func (hc *httpConn) endSink() {
	hc.flushOut()
	hc.sink = nil
}

// flushOut reports the response bytes gathered so far: before Released,
// and whenever the client is sent what was written.
func (hc *httpConn) flushOut() {
	if hc.sink != nil && hc.pend > 0 {
		hc.moved(hc.sink, hc.pend)
	}
	hc.pend = 0
}

func (w meteredWriter) ReadFrom(r io.Reader) (int64, error) {
	w.hc.mr.r = r
	n, err := w.hc.bw.ReadFrom(&w.hc.mr)
	w.hc.mr.r = nil
	return n, err
}

// meteredReader reports each read of a response body copied into bw.
type meteredReader struct {
	hc *httpConn
	r  io.Reader
}

func (m *meteredReader) Read(b []byte) (int, error) {
	n, err := m.r.Read(b)
	m.hc.wrote(n)
	return n, err
}

// meteredBody is an admitted request's body: each read reports the client
// bytes it consumed (chunk framing included) to the request's session. The
// body writer reads it.
type meteredBody struct {
	io.ReadCloser
	hc *httpConn
	s  proxy.RequestSession
}

func (b *meteredBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.hc.reportIn(b.s)
	return n, err
}

// isTimeout reports a deadline error.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
