package policy

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Defaults of UDPOptions, filled in by Compile.
const (
	// DefaultUDPIdleTimeout ends a udp session with no datagram either way
	// for this long (nginx's proxy_timeout is 10 m, IPVS's udp timeout
	// 5 m; 30 s suits DNS and QUIC, whose clients keep their own timers).
	DefaultUDPIdleTimeout = 30 * time.Second
	// DefaultUDPMaxSessions bounds the open sessions of one VIP and port
	// of a udp service: a flood of spoofed sources makes a session (and a
	// target socket) per datagram, and the bound keeps it from taking
	// every socket and the memory of the others.
	DefaultUDPMaxSessions = 10000
	// DefaultUDPResponseTimeout is how long a request/response session
	// (udp.responses set) waits for its first reply before it counts as
	// unanswered: a DNS client's first retry comes after 1-5 s.
	DefaultUDPResponseTimeout = 2 * time.Second
)

// UDPOptions tune the sessions of a udp virtual server. A session is a
// client address and port with the VIP and port it sent to: its first
// datagram admits it (the limits, the balancer: it counts as one connection
// everywhere a connection counts), and it ends after IdleTimeout with no
// datagram either way or, when Responses is set, once the target sent that
// many datagrams back. A zero field means its Default… (Compile fills them
// in).
type UDPOptions struct {
	// IdleTimeout ends a session that carried no datagram either way for
	// this long; its target slot and admission ticket are given back.
	IdleTimeout time.Duration
	// Responses, when > 0, ends a session once the target sent this many
	// datagrams back to the client, as nginx's proxy_responses: 1 for
	// DNS, whose clients send each query from a new port. 0: only the idle
	// timeout ends it.
	Responses int
	// ResponseTimeout, for a request/response session (Responses > 0),
	// is how long its first datagram waits for a reply: a session with no
	// reply by then ends and counts as unanswered. The unanswered share of
	// a target's sessions in a sampling interval is its timeout ratio
	// (monitor.timeoutRatioAndWeightFr cuts its weight as for RTO
	// timeouts); its sessions are the segments of the noise guard.
	ResponseTimeout time.Duration
	// MaxSessions bounds the open sessions of each VIP and port of the
	// service; a new session's datagram past it is dropped and counted.
	MaxSessions int
}

// resolve fills o's zero fields with the defaults and reports bad values.
func (o *UDPOptions) resolve(bad func(string, ...any), where string) {
	if o.IdleTimeout == 0 {
		o.IdleTimeout = DefaultUDPIdleTimeout
	}
	if o.IdleTimeout < 0 {
		bad("%s udp: idleTimeout %v is negative", where, o.IdleTimeout)
	}
	if o.ResponseTimeout == 0 {
		o.ResponseTimeout = DefaultUDPResponseTimeout
	}
	if o.ResponseTimeout < 0 {
		bad("%s udp: responseTimeout %v is negative", where, o.ResponseTimeout)
	}
	if o.Responses < 0 {
		bad("%s udp: responses %d is negative", where, o.Responses)
	}
	if o.MaxSessions == 0 {
		o.MaxSessions = DefaultUDPMaxSessions
	}
	if o.MaxSessions < 0 {
		bad("%s udp: maxSessions %d is negative", where, o.MaxSessions)
	}
}

// UDPCheck is the probe of a udp service's health check: one datagram sent
// to the target from a fresh connected socket, then the replies read until
// Timeout. The first reply that passes passes the check; a reply that does
// not is ignored (the failure's reason counts them). ICMP port unreachable
// (the socket's read is refused) fails the check at once.
type UDPCheck struct {
	// Send is the datagram sent, 1..HealthUDPSendMax bytes; unused (and
	// empty) with DNS set, which builds its own.
	Send []byte
	// DNS, when set, makes the probe a DNS query judged as DNS (DNSCheck).
	DNS *DNSCheck
	// Expect, when set, must be the reply's first bytes; ExpectRegexp,
	// when set, must match within the reply. Neither: any reply passes.
	// At most one is set, neither with DNS.
	Expect       []byte
	ExpectRegexp *regexp.Regexp
}

// HealthUDPSendMax bounds a UDP check's datagram: the largest UDP payload
// over IPv4.
const HealthUDPSendMax = 65507

// DNSCheck is the DNS form of a UDP check. Each probe sends a standard
// query (RD set, one question of class IN) for Name and Type with a fresh
// random ID; a reply passes when it carries that ID with the QR bit set
// and its RCODE is RCode (AnyRCode: any). A reply with another ID (a late
// answer, a spoof) is ignored.
type DNSCheck struct {
	// Name is the query name, "www.example.com" (a trailing dot is
	// optional, "." is the root): labels of 1..63 bytes, 255 bytes in
	// all on the wire; Compile checks it (ParseDNSName).
	Name string
	// Type is the question's QTYPE; zero means 1 (A).
	Type uint16
	// RCode is the RCODE a passing reply carries, 0..15 (0: NOERROR, the
	// zero value), or AnyRCode.
	RCode int
}

// AnyRCode in DNSCheck.RCode passes a reply whatever its RCODE.
const AnyRCode = -1

// dnsTypes are the QTYPE names ParseDNSType knows besides numbers.
var dnsTypes = map[string]uint16{"A": 1, "NS": 2, "CNAME": 5, "SOA": 6, "PTR": 12, "MX": 15, "TXT": 16, "AAAA": 28, "SRV": 33, "ANY": 255}

// dnsRCodes are the RCODE names ParseDNSRCode knows besides numbers (RFC
// 1035 and 2136).
var dnsRCodes = map[string]int{"NOERROR": 0, "FORMERR": 1, "SERVFAIL": 2, "NXDOMAIN": 3, "NOTIMP": 4, "REFUSED": 5}

// ParseDNSType parses a QTYPE: a name (A, AAAA, NS, CNAME, SOA, PTR, MX,
// TXT, SRV, ANY; any case) or a number 1..65535.
func ParseDNSType(s string) (uint16, error) {
	if t, ok := dnsTypes[strings.ToUpper(s)]; ok {
		return t, nil
	}
	if n, err := strconv.ParseUint(s, 10, 16); err == nil && n > 0 {
		return uint16(n), nil
	}
	return 0, fmt.Errorf("dns type %q: want A, AAAA, NS, CNAME, SOA, PTR, MX, TXT, SRV, ANY or a number 1..65535", s)
}

// ParseDNSRCode parses the RCODE a DNS check wants: a name (NOERROR,
// FORMERR, SERVFAIL, NXDOMAIN, NOTIMP, REFUSED; any case), a number 0..15,
// or "any" (AnyRCode).
func ParseDNSRCode(s string) (int, error) {
	if strings.EqualFold(s, "any") {
		return AnyRCode, nil
	}
	if c, ok := dnsRCodes[strings.ToUpper(s)]; ok {
		return c, nil
	}
	if n, err := strconv.ParseUint(s, 10, 8); err == nil && n <= 15 {
		return int(n), nil
	}
	return 0, fmt.Errorf("rcode %q: want NOERROR, FORMERR, SERVFAIL, NXDOMAIN, NOTIMP, REFUSED, a number 0..15 or any", s)
}

// ParseDNSName checks a DNS query name and returns it without its trailing
// dot (the root stays "."): labels of 1..63 bytes of letters,
// digits, '-' and '_', at most 255 bytes on the wire.
func ParseDNSName(s string) (string, error) {
	name := strings.TrimSuffix(s, ".")
	if s == "" {
		return "", fmt.Errorf("dns name is empty (the root is \".\")")
	}
	if name == "" {
		return ".", nil
	}
	if len(name)+2 > 255 {
		return "", fmt.Errorf("dns name %q is longer than 255 bytes on the wire", s)
	}
	for _, l := range strings.Split(name, ".") {
		if l == "" || len(l) > 63 {
			return "", fmt.Errorf("dns name %q: label %q must be 1..63 bytes", s, l)
		}
		for _, c := range []byte(l) {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return "", fmt.Errorf("dns name %q: %q is not a letter, digit, '-' or '_'", s, c)
			}
		}
	}
	return name, nil
}

// compile fills x's defaults and checks it; where names the check.
func (x *UDPCheck) compile(bad func(string, ...any), where string) {
	if x.Expect != nil && x.ExpectRegexp != nil {
		bad("%s health check: udp expect and expect regexp both set", where)
	}
	d := x.DNS
	if d == nil {
		if len(x.Send) == 0 || len(x.Send) > HealthUDPSendMax {
			bad("%s health check: udp send is %d bytes, want 1..%d (or send dns)", where, len(x.Send), HealthUDPSendMax)
		}
		return
	}
	if len(x.Send) > 0 {
		bad("%s health check: udp send is bytes and dns both", where)
	}
	if x.Expect != nil || x.ExpectRegexp != nil {
		bad("%s health check: udp send dns judges the reply by its ID, QR bit and rcode, not by expect bytes", where)
	}
	name, err := ParseDNSName(d.Name)
	if err != nil {
		bad("%s health check: udp send %v", where, err)
	}
	d.Name = name
	if d.Type == 0 {
		d.Type = 1
	}
	if d.RCode < AnyRCode || d.RCode > 15 {
		bad("%s health check: udp expect rcode %d is not 0..15 or any", where, d.RCode)
	}
}

// DNSRCodeName names an RCODE as ParseDNSRCode reads it: NOERROR,
// NXDOMAIN, ..., "any" for AnyRCode, else its number.
func DNSRCodeName(c int) string {
	if c == AnyRCode {
		return "any"
	}
	for name, v := range dnsRCodes {
		if v == c {
			return name
		}
	}
	return strconv.Itoa(c)
}
