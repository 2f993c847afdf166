package netstack

// Splice flow
//
//	client ──Read──► buffer (pooled, BufferSize) ──Write──► target   (this goroutine)
//	client ◄─Write── buffer (pooled, BufferSize) ◄──Read─── target   (one more goroutine)
//
// EOF on one side is passed on as CloseWrite (FIN) to the other; the
// connection ends when both directions have, or at once on any error, or
// when the idle watchdog finds no byte moved for IdleTimeout. Final counters
// are read before the legs are closed (a host socket's TCP_INFO is gone
// after).

import (
	"io"
	"sync"
	"sync/atomic"
	"time"
)

// StreamGap is the longest pause between two reads that still counts as
// one stream of data: a sender with data waiting (a bulk transfer, even a
// throttled one) delivers segment after segment with gaps well under it,
// while an interactive session's keystrokes and an idle keep-alive leave
// gaps far longer. 250 ms is above the inter-segment gap of a 50 Kbit/s
// stream of full-size segments.
const StreamGap = 250 * time.Millisecond

// connEntry is one open, spliced connection in the forwarder's registry.
type connEntry struct {
	req    ConnRequest
	d      Decision
	start  time.Time
	client *Conn
	target Leg

	toTarget atomic.Uint64 // bytes read from the client and written to the target
	toClient atomic.Uint64 // bytes read from the target and written to the client
	lastIO   atomic.Int64  // unix nanoseconds of the last byte moved
	// streamNs is a raw counter: the nanoseconds during which data kept
	// moving, in either direction, with gaps shorter than StreamGap; the
	// sampler reads it to tell a connection whose sender had data waiting
	// from an idle one (see AggSample.Waiting).
	streamNs atomic.Int64

	closeOnce sync.Once
	idle      atomic.Bool // closed by the idle watchdog
	aborted   atomic.Bool // closed by Forwarder.Close

	// Sampler state, protected by Forwarder.sampleMu.
	last     sampleState
	finished bool // final deltas taken
}

// abort closes both legs at once, which ends both copy directions.
func (c *connEntry) abort() {
	c.closeOnce.Do(func() {
		c.client.Close()
		c.target.Close()
	})
}

// splice copies between client and target until both directions end, then
// reports the connection's End to sess. It runs in the handler goroutine.
func (f *Forwarder) splice(req *ConnRequest, d Decision, sess Session, client *Conn, target Leg) {
	c := &connEntry{req: *req, d: d, start: time.Now(), client: client, target: target}
	c.lastIO.Store(c.start.UnixNano())
	c.last.at = c.start
	f.mu.Lock()
	closed := f.closed
	if !closed {
		f.conns[req.ID] = c
	}
	f.mu.Unlock()
	f.open.Add(1)
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
	if idle := f.opts.IdleTimeout; idle > 0 {
		check := func() {
			since := time.Since(time.Unix(0, c.lastIO.Load()))
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

	done := make(chan struct{})
	go func() {
		f.copyHalf(c, client, target, &c.toClient)
		close(done)
	}()
	f.copyHalf(c, target, client, &c.toTarget)
	<-done
	wdMu.Lock()
	wdStopped = true
	if watchdog != nil {
		watchdog.Stop()
	}
	wdMu.Unlock()
	if c.idle.Load() {
		f.idleClosed.Add(1)
	}

	final := f.finish(c)
	// The client leg is closed after our FIN and the client's: if the target
	// closed first, weir closed first, and the leg now waits in TIME_WAIT.
	f.tw.track(c.client)
	c.abort()
	f.open.Add(-1)
	e := End{Outcome: Served, Decision: c.d, Stats: final, Dials: req.Attempt}
	switch {
	case c.aborted.Load():
		e.Outcome = Aborted
		f.aborted.Add(1)
	case c.idle.Load():
		e.Outcome = IdleClosed
	}
	sess.End(&e)
}

// copyHalf copies src to dst until EOF (then half-closes dst) or an error
// (then aborts the connection). It counts the bytes written into n.
func (f *Forwarder) copyHalf(c *connEntry, dst, src Leg, n *atomic.Uint64) {
	bp := f.bufPool.Get().(*[]byte)
	defer f.bufPool.Put(bp)
	buf := *bp
	for {
		nr, er := src.Read(buf)
		if nr > 0 {
			now := time.Now().UnixNano()
			if gap := now - c.lastIO.Swap(now); gap >= 0 && gap < int64(StreamGap) {
				c.streamNs.Add(gap)
			}
			nw, ew := dst.Write(buf[:nr])
			n.Add(uint64(nw))
			if ew != nil {
				c.abort()
				return
			}
		}
		if er == io.EOF {
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
