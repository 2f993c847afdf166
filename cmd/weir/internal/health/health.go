// Package health runs weir's active health checks: the control-plane half
// of health checking. The balancer keeps each target's rise/fall state
// (balancer.Health, Balancer.ReportCheck) and never dials; a Checker dials
// each target the way its connections go (the target's own `via`: a host
// socket or the back arm) and reports each verdict with its reason.
//
// A check dials a fresh connection within the timeout, which bounds the
// whole check. With no probe it passes when the TCP handshake completes; an
// HTTP probe sends one request and judges the response's status; a
// send/expect probe writes Send and judges the first bytes read against
// Expect or ExpectRegexp. A target that takes a PROXY-protocol header
// (Target.ProxyProtocol) gets the address-less one first (v2 LOCAL, v1
// UNKNOWN), before the probe. The connection is closed at the end. A udp
// service's check is the udp probe (udp.go): one datagram from a fresh
// connected UDP socket, the replies judged until the timeout.
package health

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"weir/netstack/proxy/proxyproto"
	"weir/policy"
)

// DialFunc connects to addr; the context carries the check's timeout.
type DialFunc func(ctx context.Context, addr netip.AddrPort) (net.Conn, error)

// HostDial dials a kernel TCP socket: how `via: host` targets are checked.
func HostDial(ctx context.Context, addr netip.AddrPort) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, "tcp", addr.String())
}

// Target is one target to check.
type Target struct {
	// Name is what the verdict is reported under (the balancer's target
	// name).
	Name string
	// Addr is the address checked; an invalid Addr fails without a dial.
	Addr netip.AddrPort
	// Dial connects to Addr the way the target's connections go; nil is
	// HostDial.
	Dial DialFunc
	// DialUDP opens the udp probe's socket to Addr the way the target's
	// sessions go; nil is HostDialUDP.
	DialUDP UDPDialFunc
	// ProxyProtocol is the target's PROXY-protocol version: the check
	// writes that version's address-less header (v2 LOCAL, v1 UNKNOWN)
	// first, as weir's own connection, before the probe.
	ProxyProtocol policy.ProxyProtocol
}

// Plan is what one round checks: the settings and the targets, both taken
// from the config current when the round starts.
type Plan struct {
	// Settings' Interval is the time between rounds (0: checks off),
	// Timeout each dial's bound (policy.Compile's default: Interval/2).
	// Rise and fall counting is the balancer's.
	Settings policy.HealthCheck
	Targets  []Target
}

// Checker runs rounds of checks. The zero value is not usable: Plan and
// Report are required.
type Checker struct {
	// Plan returns the round to run; it is called at the start of each.
	Plan func() Plan
	// Report receives each verdict, at the time Now returned when the
	// check ended. It is called from the check's goroutine, concurrently
	// with the other checks of the round.
	Report func(name string, r Result, now time.Time)
	// Parallel bounds the checks in flight at once; 0 means 32.
	Parallel int
	// Now returns the time verdicts are reported at; nil means time.Now.
	Now func() time.Time
}

// IdleRecheck is how often a Checker whose plan has checks turned off
// (Interval 0) looks again, so that a reload turning them on takes effect.
const IdleRecheck = time.Second

// Loop runs rounds until ctx is done; it runs in its own goroutine
// (`go c.Loop(ctx)`) and returns ctx.Err() only after every check it
// started has finished, so it leaks no goroutine.
func (c *Checker) Loop(ctx context.Context) error {
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-timer.C:
		}
		if ctx.Err() != nil {
			return ctx.Err() // both were ready: the select may have picked the timer
		}
		p := c.Plan()
		if p.Settings.Interval <= 0 {
			timer.Reset(IdleRecheck)
			continue
		}
		c.round(ctx, p)
		timer.Reset(p.Settings.Interval)
	}
}

// CheckOnce runs one round and returns when every verdict has been
// reported (or ctx is done). With checks off (no Interval) it checks
// nothing: no later round would undo its verdicts.
func (c *Checker) CheckOnce(ctx context.Context) {
	if p := c.Plan(); p.Settings.Interval > 0 {
		c.round(ctx, p)
	}
}

func (c *Checker) round(ctx context.Context, p Plan) {
	now := c.Now
	if now == nil {
		now = time.Now
	}
	par := c.Parallel
	if par <= 0 {
		par = 32
	}
	sem := make(chan struct{}, par)
	var wg sync.WaitGroup
	defer wg.Wait()
	for _, t := range p.Targets {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return
		}
		if ctx.Err() != nil {
			<-sem
			return
		}
		wg.Go(func() {
			defer func() { <-sem }()
			r := Check(ctx, t, &p.Settings)
			if ctx.Err() != nil {
				return // cancelled, not a verdict on the target
			}
			c.Report(t.Name, r, now())
		})
	}
}

// Result is one check's verdict.
type Result struct {
	OK bool
	// Reason says why a check failed: one of the Reason constants, "status
	// NNN" for an HTTP status outside the passing range, or a short error
	// text. Empty when OK.
	Reason string
}

// The reasons a check fails, besides "status NNN".
const (
	ReasonRefused   = "refused"         // the connect was refused (RST)
	ReasonTimeout   = "timeout"         // no connect or no answer within the timeout
	ReasonUnreach   = "unreachable"     // no route to the target
	ReasonReset     = "reset"           // the connection was reset after it was up
	ReasonClosed    = "closed"          // the target closed before answering
	ReasonMismatch  = "expect mismatch" // the first bytes do not match expect (udp: no reply passed, some came; the reason goes on to say what)
	ReasonBadReply  = "bad response"    // not an HTTP response
	ReasonNoAddress = "no address"      // the target has no address to check
)

// Check runs one check of t with h's probe, bounded by h.Timeout (0: no
// bound but ctx's).
func Check(ctx context.Context, t Target, h *policy.HealthCheck) Result {
	if !t.Addr.IsValid() {
		return Result{Reason: ReasonNoAddress}
	}
	dial := t.Dial
	if dial == nil {
		dial = HostDial
	}
	if h.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, h.Timeout)
		defer cancel()
	}
	if h.UDP != nil {
		return checkUDP(ctx, t, h.UDP)
	}
	conn, err := dial(ctx, t.Addr)
	if err != nil {
		return Result{Reason: reason(ctx, err)}
	}
	defer conn.Close()
	if !h.HasProbe() && t.ProxyProtocol == policy.ProxyNone {
		return Result{OK: true}
	}
	if d, ok := ctx.Deadline(); ok {
		conn.SetDeadline(d)
	}
	// Stop a blocked read or write when ctx ends before its deadline (the
	// checker is stopped).
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	// Where a target gets a PROXY-protocol header on its connections, the
	// check writes one too, before the probe, so that the target sees a
	// check as it sees traffic: the address-less one (v2 LOCAL, v1
	// UNKNOWN), since the check is weir's own connection.
	if t.ProxyProtocol != policy.ProxyNone {
		hdr := proxyproto.Append(nil, proxyproto.Version(t.ProxyProtocol), netip.AddrPort{}, netip.AddrPort{})
		if _, err := conn.Write(hdr); err != nil {
			return Result{Reason: reason(ctx, err)}
		}
		if !h.HasProbe() {
			return Result{OK: true}
		}
	}
	if h.HTTP != nil {
		return probeHTTP(ctx, conn, t, h.HTTP)
	}
	return probeExpect(ctx, conn, h)
}

// probeHTTP sends one request and judges the response's status.
func probeHTTP(ctx context.Context, conn net.Conn, t Target, x *policy.HTTPCheck) Result {
	host := x.Host
	if host == "" {
		host = t.Addr.String()
	}
	req := x.Method + " " + x.Path + " HTTP/1.1\r\nHost: " + host + "\r\nUser-Agent: weir-health-check\r\nAccept: */*\r\nConnection: close\r\n\r\n"
	if _, err := io.WriteString(conn, req); err != nil {
		return Result{Reason: reason(ctx, err)}
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), &http.Request{Method: x.Method})
	if err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || isTimeout(ctx, err) || isErrno(err, syscall.ECONNRESET) {
			return Result{Reason: reason(ctx, err)}
		}
		return Result{Reason: ReasonBadReply}
	}
	resp.Body.Close()
	if !x.Status.Contains(resp.StatusCode) {
		return Result{Reason: fmt.Sprintf("status %d", resp.StatusCode)}
	}
	return Result{OK: true}
}

// probeExpect writes Send and reads until the first bytes decide Expect or
// ExpectRegexp (none: passing once Send is written).
func probeExpect(ctx context.Context, conn net.Conn, h *policy.HealthCheck) Result {
	if h.Send != "" {
		if _, err := io.WriteString(conn, h.Send); err != nil {
			return Result{Reason: reason(ctx, err)}
		}
	}
	want, re := []byte(h.Expect), h.ExpectRegexp
	if len(want) == 0 && re == nil {
		return Result{OK: true}
	}
	limit := policy.HealthExpectMax
	if re == nil {
		limit = len(want)
	}
	buf := make([]byte, 0, limit)
	for {
		n, err := conn.Read(buf[len(buf):limit])
		buf = buf[:len(buf)+n]
		if re != nil {
			if re.Match(buf) {
				return Result{OK: true}
			}
			if len(buf) == limit {
				return Result{Reason: ReasonMismatch}
			}
		} else {
			if !bytes.HasPrefix(want, buf) {
				return Result{Reason: ReasonMismatch}
			}
			if len(buf) == len(want) {
				return Result{OK: true}
			}
		}
		if err != nil {
			if len(buf) > 0 && re != nil {
				// Bytes came and did not match before the end or the
				// timeout: the answer is wrong, not missing.
				return Result{Reason: ReasonMismatch}
			}
			return Result{Reason: reason(ctx, err)}
		}
	}
}

// reason names a dial, read or write error.
func reason(ctx context.Context, err error) string {
	switch {
	case isTimeout(ctx, err):
		return ReasonTimeout
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return ReasonClosed
	case isErrno(err, syscall.ECONNREFUSED):
		return ReasonRefused
	case isErrno(err, syscall.ECONNRESET), isErrno(err, syscall.EPIPE):
		return ReasonReset
	case isErrno(err, syscall.EHOSTUNREACH), isErrno(err, syscall.ENETUNREACH):
		return ReasonUnreach
	}
	// The back arm's errors (gVisor's) carry only their text.
	msg := err.Error()
	for _, r := range []struct{ text, reason string }{
		{"refused", ReasonRefused}, {"reset", ReasonReset}, {"unreachable", ReasonUnreach}, {"timed out", ReasonTimeout},
	} {
		if strings.Contains(msg, r.text) {
			return r.reason
		}
	}
	if len(msg) > 60 {
		msg = msg[:60]
	}
	return msg
}

func isTimeout(ctx context.Context, err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded) || ctx.Err() != nil
}

func isErrno(err error, e syscall.Errno) bool { return errors.Is(err, e) }

// ServiceTargets lists the checks of vs's targets: each at the address a
// client's connection to the service's first port goes to (a target that
// keeps the client's port is checked there), dialed by dial(t.Via), or
// for the udp probe by dialUDP(t.Via) (a nil dialUDP: host sockets).
func ServiceTargets(vs *policy.VirtualServer, dial func(policy.DialVia) DialFunc, dialUDP func(policy.DialVia) UDPDialFunc) []Target {
	out := make([]Target, 0, len(vs.Targets))
	for _, t := range vs.Targets {
		ct := Target{Name: t.Name, Dial: dial(t.Via), ProxyProtocol: t.ProxyProtocol}
		if dialUDP != nil {
			ct.DialUDP = dialUDP(t.Via)
		}
		if t.Addr.IsValid() {
			ct.Addr = t.DialAddr(vs.Ports.Lo)
		}
		out = append(out, ct)
	}
	return out
}
