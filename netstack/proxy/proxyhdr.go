package proxy

// The PROXY protocol (HAProxy's doc/proxy-protocol.txt), both ways
//
// Accepting (a virtual server's AcceptProxy): the first step of a
// connection, before admission and before an http service's first
// request, is readProxyHeader. A connection from an address outside the
// service's TrustedProxies is refused unread; a trusted one must send its
// header within timeouts.handshake, read byte-exact and bounded in size by
// proxyproto.Read, or it is refused. A refusal is a RST for a tcp service
// and a 400 for an http one, counted by reason (ProxyReasons). An accepted
// header's client becomes req.Client (the connection's own address moves
// to req.Peer): the rules, limits, balancer hash, access log and forwarded
// headers all see the real client from then on. A LOCAL header (the outer
// load balancer's own health check) keeps the connection's addresses.
//
// Sending (a target's ProxyProtocol): dial writes the header of the
// target's version (req.Client, req.VIP) on every target connection before
// anything else, whichever Dialer opened it; a failed write is a failed
// dial.

import (
	"context"
	"errors"
	"io"
	"net/netip"
	"time"

	"weir/netstack/proxy/proxyproto"
	"weir/policy"
)

// The reasons a connection's PROXY-protocol header is refused, the index
// into Stats.ProxyRefused: ProxyReasons[i] names reason i.
const (
	ProxyUntrusted = iota // the connection came from outside trustedProxies
	ProxyMissing          // no header of an accepted version (or the connection closed first)
	ProxyMalformed        // a header against the spec, or over its bounds
	ProxyTimeout          // no whole header within timeouts.handshake
	ProxyError            // the read failed otherwise (reset)
	NumProxyReasons
)

// ProxyReasons names the refusal reasons, as the metric's reason label.
var ProxyReasons = [NumProxyReasons]string{"untrusted", "missing", "malformed", "timeout", "error"}

// proxyReason maps a proxyproto.Read error to its reason index.
func proxyReason(err error) int {
	switch proxyproto.Reason(err) {
	case "missing":
		return ProxyMissing
	case "malformed":
		return ProxyMalformed
	case "timeout":
		return ProxyTimeout
	}
	return ProxyError
}

// ProxyRefusal is what OnProxyRefused hears of a refused header.
type ProxyRefusal struct {
	Peer   netip.AddrPort // the connection's address and port
	VIP    netip.AddrPort
	Reason string // one of ProxyReasons
	Err    error  // the read's error; nil for untrusted
}

// readProxyHeader reads the PROXY-protocol header a connection to a
// service with AcceptProxy starts with, and takes its client address into
// req. It reports false when it refused the connection (counted, the
// client reset or answered 400, closed).
func (p *Proxy) readProxyHeader(req *ConnRequest, client Client) bool {
	vs := req.Service
	if vs.AcceptProxy == policy.ProxyNone {
		return true
	}
	if !vs.Trusted(req.Client.Addr()) {
		p.refuseProxy(req, client, ProxyUntrusted, nil)
		return false
	}
	timeout := vs.Timeouts.Handshake
	if timeout <= 0 { // a service policy.Compile did not fill
		timeout = policy.DefaultHandshakeTimeout
	}
	_ = client.SetReadDeadline(time.Now().Add(timeout))
	// Held while it waits, so that Close ends the wait (it closes the
	// connection) rather than wait up to the timeout for it.
	release := p.Hold(client)
	h, err := proxyproto.Read(client, proxyproto.Version(vs.AcceptProxy))
	release()
	_ = client.SetReadDeadline(time.Time{})
	if err != nil && p.Closed() {
		p.count.Aborted.Add(1)
		client.Reset()
		return false
	}
	if err != nil {
		p.refuseProxy(req, client, proxyReason(err), err)
		return false
	}
	if !h.Local {
		req.Peer = req.Client
		req.Client = netip.AddrPortFrom(h.Src.Addr().Unmap(), h.Src.Port())
	}
	return true
}

// refuseProxy counts and answers a refused header: RST for a tcp service,
// 400 for an http one.
func (p *Proxy) refuseProxy(req *ConnRequest, client Client, reason int, err error) {
	p.count.ProxyRefused[reason].Add(1)
	if f := p.opts.OnProxyRefused; f != nil {
		f(req, ProxyRefusal{Peer: req.Client, VIP: req.VIP, Reason: ProxyReasons[reason], Err: err})
	}
	if req.Service.Proto != policy.ProtoHTTP {
		client.Reset()
		return
	}
	serve400(client, req.Service.Timeouts.RequestRead)
}

// page400 is the answer to an http connection whose header was refused.
const page400 = "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: 44\r\nConnection: close\r\n\r\n400 Bad Request: no valid PROXY header here\n"

// serve400 writes page400, half-closes, drains what the client still sends
// (bounded) and closes, so that the close does not reset the answer away.
func serve400(c Client, timeout time.Duration) {
	defer c.Close()
	_ = c.SetWriteDeadline(time.Now().Add(timeout))
	if _, err := io.WriteString(c, page400); err != nil {
		return
	}
	_ = c.CloseWrite()
	_ = c.SetReadDeadline(time.Now().Add(timeout))
	_, _ = io.CopyN(io.Discard, c, DrainLimit)
}

// errProxyWrite wraps a failed header write to a target.
var errProxyWrite = errors.New("proxy: writing the PROXY-protocol header to the target")

// sendProxyHeader writes the header of version v for a connection from
// src to dst on leg, within ctx's deadline.
func sendProxyHeader(ctx context.Context, leg Leg, v policy.ProxyProtocol, src, dst netip.AddrPort) error {
	var buf [proxyproto.MaxV1Len + 64]byte
	b := proxyproto.Append(buf[:0], proxyproto.Version(v), src, dst)
	if dl, ok := ctx.Deadline(); ok {
		_ = leg.SetWriteDeadline(dl)
		defer leg.SetWriteDeadline(time.Time{})
	}
	if _, err := leg.Write(b); err != nil {
		return errors.Join(errProxyWrite, err)
	}
	return nil
}
