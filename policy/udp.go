package policy

import "time"

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
