package proxy

// Splice flow
//
//	client ──Read──► buffer (pooled, BufferSize; lent only while data waits) ──Write──► target   (this goroutine)
//	client ◄─Write── buffer (pooled, BufferSize) ◄──Read─── target   (one more goroutine)
//
// EOF on one side is passed on as CloseWrite (FIN) to the other; the
// connection ends when both directions have, or at once on any error, or
// when the idle watchdog finds no byte moved for the idle timeout. Final
// counters are read before the legs are closed (a host socket's TCP_INFO is
// gone after).
//
// First byte: when the client's first bytes have reached the target, a
// timer waits the first-byte timeout for the target's first byte. If it
// fires first, the target leg is closed, the Session hears TargetFailed
// (before the release, which gives the lease back: reported after it, the
// target would never be marked down), and the target→client half sends the
// 503 page (http) or resets the client (tcp). fb orders the race of the two: whoever moves it from
// fbWaiting wins.
//
// Finished as the client sees it: the connection is over for the client
// once it has sent its FIN (or reset) and weir has sent it weir's FIN; the
// splice may still have work to do (the target's FIN, final counters,
// teardown), but a client that reconnects at once must not find its slot
// taken. So the half that completes the second of the two client-side closes
// calls Session.Released right then (an error or an abort counts as both),
// before it does anything else; End follows after the teardown.
//
// A panic in either half is recovered there: it ends this connection
// (Outcome Panicked), not the process.

import (
	"fmt"
	"io"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"weir/policy"
)

// First-byte states of a connEntry.
const (
	fbWaiting int32 = iota // the target has sent nothing yet
	fbSpoke                // the target sent its first byte in time
	fbExpired              // the first-byte timeout fired first
)

// connEntry is one open, spliced connection in the forwarder's registry.
type connEntry struct {
	req    ConnRequest
	d      Decision
	start  time.Time
	client Client
	target Leg

	toTarget atomic.Uint64 // bytes read from the client and written to the target
	toClient atomic.Uint64 // bytes read from the target and written to the client
	// spliced hears the bytes written (Session.Spliced).
	spliced Session
	lastIO  atomic.Int64 // unix nanoseconds of the last byte moved
	// streamNs is a raw counter: the nanoseconds during which data kept
	// streaming, in either direction (what each half's StreamMeter
	// credits); the sampler reads it to tell a connection whose sender
	// had data waiting from an idle or interactive one (AggSample.Waiting).
	streamNs atomic.Int64

	closeOnce sync.Once
	// rel releases the connection on the client's FIN (Release);
	// nil for an http target connection, whose requests' Sessions hear
	// Released from serveHTTP.
	rel      *Release
	idle     atomic.Bool  // closed by the idle watchdog
	aborted  atomic.Bool  // closed by Proxy.Close
	panicked atomic.Value // the first panic's value, if a half panicked

	fb      atomic.Int32 // fbWaiting, fbSpoke or fbExpired
	fbArmed atomic.Bool  // the first-byte timer was started
	// fbReported: the Session heard TargetFailed before the release (the
	// lease it marks the target down with still held).
	fbReported atomic.Bool
	fbTimer    atomic.Pointer[time.Timer]

	// Sampler state, protected by Proxy.sampleMu.
	last     sampleState
	finished bool              // final deltas taken
	addrs    [2]netip.AddrPort // the target leg's local and remote addresses, for Options.Meter
	// pooled: an http target connection idle in the pool, which belongs to
	// no request, so to no level, and is not an active connection.
	pooled bool
}

// clientDone records one client-side close (ClientRcvClosed or
// ClientSndClosed); once both are done the connection is finished as
// the client sees it and its slots are released.
func (c *connEntry) clientDone(bit uint32) { c.rel.ClientDone(bit) }

// release tells the Session, once, that the client is done with the
// connection. A second caller waits until the first call has returned, so
// End (which calls it first) always follows Released.
func (c *connEntry) release() { c.rel.Release() }

// abort closes both legs at once, which ends both copy directions; the
// client is done with the connection from here on.
func (c *connEntry) abort() {
	c.release() // before the client can see the close
	c.closeOnce.Do(func() {
		c.client.Close()
		c.target.Close()
	})
}

// splice starts copying between client and target; once both directions
// have ended, endSplice reports the connection's End to sess. It returns at
// once: the copying runs on two goroutines of its own.
func (f *Proxy) splice(req *ConnRequest, d Decision, sess Session, client Client, target Leg, t policy.Timeouts) {
	c := &connEntry{req: *req, d: d, start: f.Now(), client: client, target: target}
	c.spliced = sess
	c.rel = f.closing.Track(req.Client.Addr(), client, sess)
	c.lastIO.Store(c.start.UnixNano())
	c.last.at = c.start
	f.mu.Lock()
	closed := f.closed
	if !closed {
		f.conns[req.ID] = c
	}
	f.mu.Unlock()
	f.count.Open.Add(1)
	if closed {
		c.aborted.Store(true)
		c.abort()
	}

	// The idle watchdog rearms itself for the rest of the idle time; wdMu
	// orders its first assignment before the callback's use.
	var (
		wdMu      sync.Mutex
		watchdog  *time.Timer // protected by wdMu
		wdStopped bool        // protected by wdMu
	)
	if idle := t.Idle; idle > 0 {
		check := func() {
			since := f.Now().Sub(time.Unix(0, c.lastIO.Load()))
			if since >= idle {
				c.idle.Store(true)
				c.abort()
				return
			}
			wdMu.Lock()
			if !wdStopped {
				watchdog.Reset(idle - since)
			}
			wdMu.Unlock()
		}
		wdMu.Lock()
		watchdog = time.AfterFunc(idle, check)
		wdMu.Unlock()
	}

	// Each half runs on a goroutine of its own, and the one that ends last
	// finishes the connection; the goroutine that served the handshake goes
	// back to the pool. An idle connection so parks two shallow goroutines
	// whose stacks the runtime can halve down to 4 KiB, where a half run
	// on the serving goroutine parked under serve's and splice's frames
	// (~4 KiB in use: its stack could not drop below 8 KiB). Close waits
	// for the finish through f.wg.
	http := req.Service != nil && req.Service.Proto == policy.ProtoHTTP
	f.wg.Add(1)
	var left atomic.Int32
	left.Store(2)
	halfDone := func() {
		if left.Add(-1) != 0 {
			return
		}
		defer f.wg.Done()
		reqp := &c.req
		defer f.recoverConn(&reqp, c.abort)
		if tm := c.fbTimer.Load(); tm != nil {
			tm.Stop()
		}
		wdMu.Lock()
		wdStopped = true
		if watchdog != nil {
			watchdog.Stop()
		}
		wdMu.Unlock()
		f.endSplice(c, sess, req.Attempt)
	}
	f.workers.Go(func() {
		defer halfDone()
		f.guard(c, func() { f.copyToClient(c, d, sess, http, t.RequestRead) })
	})
	f.workers.Go(func() {
		defer halfDone()
		f.guard(c, func() { f.copyHalf(c, target, client, &c.toTarget, t.FirstByte) })
	})
}

// endSplice finishes a spliced connection once both halves have ended: its
// final counters, TIME_WAIT tracking, and the session's End.
func (f *Proxy) endSplice(c *connEntry, sess Session, dials int) {
	if c.idle.Load() {
		f.count.IdleClosed.Add(1)
	}
	c.release() // a path that set neither close bit (the first-byte 503)
	final := f.finish(c)
	// The client leg is closed after our FIN and the client's: if the target
	// closed first, weir closed first, and the leg now waits in TIME_WAIT.
	c.client.Closing()
	c.abort()
	f.count.Open.Add(-1)
	e := End{Outcome: Served, Decision: c.d, Stats: final, Dials: dials}
	switch {
	case c.panicked.Load() != nil:
		e.Outcome = Panicked
		e.Err = fmt.Errorf("panic: %v", c.panicked.Load())
	case c.aborted.Load():
		e.Outcome = Aborted
		f.count.Aborted.Add(1)
	case c.fb.Load() == fbExpired:
		e.Outcome = TargetTimedOut
		e.Err = ErrFirstByteTimeout
		f.count.TargetTimedOut.Add(1)
		if !c.fbReported.Load() {
			// Released already (the idle watchdog, or the target's
			// FIN before the timer): reported all the same.
			sess.TargetFailed(c.d, ErrFirstByteTimeout)
		}
	case c.idle.Load():
		e.Outcome = IdleClosed
	}
	sess.End(&e)
}

// guard runs one half of a splice, recovering a panic in it: the panic is
// counted and reported, and the connection aborted (which ends the other
// half too).
func (f *Proxy) guard(c *connEntry, half func()) {
	defer func() {
		if v := recover(); v != nil {
			c.panicked.CompareAndSwap(nil, panicValue{v})
			c.abort()
			req := &c.req
			f.recoverConnValue(&req, v)
		}
	}()
	half()
}

// panicValue boxes a panic value for atomic.Value (which wants one
// concrete type).
type panicValue struct{ v any }

func (p panicValue) String() string { return fmt.Sprint(p.v) }

// copyToClient copies target to client; on the first byte it wins the
// first-byte race, and if the timer won instead it reports the silent
// target to sess (TargetFailed, before anything releases the connection:
// a released Session's lease has no target left to mark down) and answers
// the client for it: the 503 page for http (d's Reason names the
// timeout), RST for tcp. write bounds sending the page (the service's
// RequestRead).
func (f *Proxy) copyToClient(c *connEntry, d Decision, sess Session, http bool, write time.Duration) {
	f.copyHalf(c, c.client, c.target, &c.toClient, 0)
	if c.fb.Load() != fbExpired || c.aborted.Load() {
		return
	}
	c.fbReported.Store(c.rel.Report(func() { sess.TargetFailed(c.d, ErrFirstByteTimeout) }))
	if http && c.toClient.Load() == 0 {
		d.Limit, d.Value, d.Reason = "firstByte", 0, "the target sent no response in time"
		_ = c.client.SetWriteDeadline(time.Now().Add(write))
		if _, err := c.client.Write(PageOf(d).Render("close")); err == nil {
			c.clientDone(ClientSndClosed)
			_ = c.client.CloseWrite()
		}
	} else {
		c.client.Reset()
	}
	c.abort()
}

// copyHalf copies src to dst until EOF (then half-closes dst) or an error
// (then aborts the connection). It counts the bytes written into n. With
// firstByte > 0 (the client→target half) its first write to the target
// starts the first-byte timer; the target→client half (firstByte 0) ends
// the wait with its first byte. Once the timer has won, errors no longer
// abort: copyToClient answers the client first.
func (f *Proxy) copyHalf(c *connEntry, dst, src Leg, n *atomic.Uint64, firstByte time.Duration) {
	// The buffer is lent only while src has data waiting (Leg.ReadLent).
	var bp *[]byte
	defer func() { f.returnBuffer(bp) }()
	toClient := dst == Leg(c.client)
	var sm StreamMeter // this half's reads, for streamNs
	for {
		var nr int
		var er error
		bp, nr, er = src.ReadLent(&f.bufPool, bp)
		if nr > 0 {
			buf := *bp
			if toClient && !c.fb.CompareAndSwap(fbWaiting, fbSpoke) && c.fb.Load() == fbExpired {
				return
			}
			now := f.Now().UnixNano()
			if cr := sm.Read(now, now-c.lastIO.Swap(now), nr); cr > 0 {
				c.streamNs.Add(cr)
			}
			nw, ew := dst.Write(buf[:nr])
			n.Add(uint64(nw))
			if c.spliced != nil && nw > 0 {
				c.spliced.Spliced(int64(nw))
			}
			if ew != nil {
				if c.fb.Load() != fbExpired {
					c.abort()
				}
				return
			}
			if firstByte > 0 && c.fbArmed.CompareAndSwap(false, true) {
				c.fbTimer.Store(time.AfterFunc(firstByte, func() {
					if c.fb.CompareAndSwap(fbWaiting, fbExpired) {
						c.target.Close()
					}
				}))
			}
		}
		if er != nil && c.fb.Load() == fbExpired {
			return
		}
		if er == io.EOF {
			// Released comes before the FIN that may finish the
			// connection for the client: before weir's FIN to the client,
			// and on the client's FIN before it is passed on.
			if toClient {
				c.clientDone(ClientSndClosed)
			} else {
				c.clientDone(ClientRcvClosed)
			}
			if dst.CloseWrite() != nil {
				c.abort()
			}
			return
		}
		if er != nil {
			c.abort()
			return
		}
	}
}
