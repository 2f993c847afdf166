package health

// The udp probe: the health check of a udp service's targets. One datagram
// from a fresh connected socket (a host socket, or the back arm's for `via:
// netstack` targets: the socket a session's datagrams would take), then the
// replies read until the timeout. The first reply that passes passes the
// check; ICMP port unreachable (the read refused) fails it at once; a reply
// that does not pass is ignored, counted in the reason if nothing passes.

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strings"
	"sync"

	udprelay "weir/netstack/proxy/udp"
	"weir/policy"
)

// UDPDialFunc opens a UDP socket connected to addr (a udprelay.Dialer's
// DialUDP); the context carries the check's timeout.
type UDPDialFunc func(ctx context.Context, addr netip.AddrPort) (udprelay.Target, error)

// HostDialUDP opens a connected kernel UDP socket: how the udp probe
// reaches `via: host` targets, as their sessions do.
func HostDialUDP(ctx context.Context, addr netip.AddrPort) (udprelay.Target, error) {
	var d udprelay.HostDialer
	return d.DialUDP(ctx, addr)
}

// replies holds the buffers replies are read into (udprelay.Target's
// pool: *[]byte of MaxDatagram bytes).
var replies = sync.Pool{New: func() any {
	b := make([]byte, udprelay.MaxDatagram)
	return &b
}}

// checkUDP runs the udp probe x against t within ctx (the check's
// timeout).
func checkUDP(ctx context.Context, t Target, x *policy.UDPCheck) Result {
	dial := t.DialUDP
	if dial == nil {
		dial = HostDialUDP
	}
	sock, err := dial(ctx, t.Addr)
	if err != nil {
		return Result{Reason: reason(ctx, err)}
	}
	defer sock.Close()
	msg, id := x.Send, uint16(0)
	if x.DNS != nil {
		// A fresh ID each probe: a reply to an earlier one, or a guess,
		// does not pass this one.
		id = uint16(rand.Uint32())
		msg = appendDNSQuery(nil, x.DNS, id)
	}
	if _, err := sock.Write(msg); err != nil {
		return Result{Reason: reason(ctx, err)}
	}
	// A read waits for a datagram with no deadline of its own: the end of
	// ctx (the timeout, or the checker stopped) closes the socket.
	stop := context.AfterFunc(ctx, func() { sock.Close() })
	defer stop()
	ignored, last := 0, ""
	for {
		bp, n, err := sock.ReadDatagram(&replies)
		if err != nil {
			if ignored > 0 && isTimeout(ctx, err) {
				return Result{Reason: fmt.Sprintf("%s: %d %s ignored, last: %s", ReasonMismatch, ignored, plural(ignored, "reply", "replies"), last)}
			}
			return Result{Reason: reason(ctx, err)}
		}
		why, final := judgeUDP(x, (*bp)[:n], id)
		replies.Put(bp)
		if why == "" {
			return Result{OK: true}
		}
		if final {
			return Result{Reason: why}
		}
		ignored++
		last = why
	}
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// judgeUDP judges one reply b to the probe x (sent with DNS ID id): why is
// empty when it passes; final says a failing reply decides the check (the
// DNS answer to this query with another rcode) rather than being ignored.
func judgeUDP(x *policy.UDPCheck, b []byte, id uint16) (why string, final bool) {
	if d := x.DNS; d != nil {
		return judgeDNS(d, b, id)
	}
	switch {
	case x.ExpectRegexp != nil:
		if !x.ExpectRegexp.Match(b) {
			return fmt.Sprintf("%d bytes %s not matching the regexp", len(b), head(b)), false
		}
	case x.Expect != nil:
		if !bytes.HasPrefix(b, x.Expect) {
			return fmt.Sprintf("%d bytes %s not beginning with expect", len(b), head(b)), false
		}
	}
	return "", false
}

// head shows a reply's first bytes in hex.
func head(b []byte) string {
	const n = 8
	if len(b) > n {
		return fmt.Sprintf("%x…", b[:n])
	}
	return fmt.Sprintf("%x", b)
}

// DNS header (RFC 1035 4.1.1): ID, then QR|Opcode|AA|TC|RD, RA|Z|RCODE,
// then the four counts.
const (
	dnsHeaderLen = 12
	dnsQR        = 0x80 // in byte 2
	dnsRD        = 0x01 // in byte 2
	dnsRCodeMask = 0x0f // in byte 3
	dnsClassIN   = 1
)

// appendDNSQuery appends a standard query for d's name and type, class
// IN, recursion desired, with id.
func appendDNSQuery(b []byte, d *policy.DNSCheck, id uint16) []byte {
	b = binary.BigEndian.AppendUint16(b, id)
	b = append(b, dnsRD, 0, 0, 1, 0, 0, 0, 0, 0, 0) // flags; QDCOUNT 1
	if d.Name != "." && d.Name != "" {
		for _, l := range strings.Split(d.Name, ".") {
			b = append(b, byte(len(l)))
			b = append(b, l...)
		}
	}
	b = append(b, 0)
	qtype := d.Type
	if qtype == 0 {
		qtype = 1
	}
	b = binary.BigEndian.AppendUint16(b, qtype)
	return binary.BigEndian.AppendUint16(b, dnsClassIN)
}

// judgeDNS judges a reply to the query with id: it passes with that ID,
// QR set and d's rcode. Another ID, a short datagram or QR clear (the
// query itself echoed) is not the answer and is ignored; the answer with
// the wrong rcode fails the check at once.
func judgeDNS(d *policy.DNSCheck, b []byte, id uint16) (why string, final bool) {
	if len(b) < dnsHeaderLen {
		return fmt.Sprintf("%d bytes, shorter than a DNS header", len(b)), false
	}
	if got := binary.BigEndian.Uint16(b); got != id {
		return fmt.Sprintf("DNS ID 0x%04x, want 0x%04x", got, id), false
	}
	if b[2]&dnsQR == 0 {
		return "DNS QR bit clear (the query echoed, not an answer)", false
	}
	if rc := int(b[3] & dnsRCodeMask); d.RCode != policy.AnyRCode && rc != d.RCode {
		return fmt.Sprintf("DNS rcode %s, want %s", policy.DNSRCodeName(rc), policy.DNSRCodeName(d.RCode)), true
	}
	return "", false
}
