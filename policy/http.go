package policy

import (
	"fmt"
	"strconv"
	"time"
)

// Defaults of HTTPOptions, filled in by Compile for every virtual server.
const (
	DefaultHeaderTimeout    = 10 * time.Second // a request head, first byte to blank line
	DefaultMaxHeaderBytes   = 32 << 10         // a request head's size
	DefaultKeepAliveIdle    = 60 * time.Second // a client connection with no request in flight
	DefaultMaxClients       = 10000            // open client connections per http virtual server
	DefaultBackendIdle      = 30 * time.Second // a pooled target connection unused
	DefaultMaxIdlePerTarget = 32               // pooled target connections per target
)

// Forwarded says which headers an http virtual server adds to name the
// client to its targets.
type Forwarded uint8

const (
	// ForwardXFF appends the client's address to X-Forwarded-For (the
	// default).
	ForwardXFF Forwarded = iota
	// ForwardRFC7239 appends `for=<client>` to Forwarded (RFC 7239).
	ForwardRFC7239
	// ForwardBoth does both.
	ForwardBoth
	// ForwardNone adds neither (the headers the client sent pass on).
	ForwardNone
)

var forwardedNames = [...]string{"x-forwarded-for", "forwarded", "both", "none"}

func (f Forwarded) String() string {
	if int(f) < len(forwardedNames) {
		return forwardedNames[f]
	}
	return "forwarded(" + strconv.Itoa(int(f)) + ")"
}

// ParseForwarded parses "x-forwarded-for", "forwarded", "both" or "none".
func ParseForwarded(s string) (Forwarded, error) {
	for i, n := range forwardedNames {
		if s == n {
			return Forwarded(i), nil
		}
	}
	return 0, fmt.Errorf("unknown forwarded %q (want x-forwarded-for, forwarded, both or none)", s)
}

// HTTPOptions tune an http virtual server's request handling: weir parses
// each request head on the client connection, admits and routes the request
// on its own, and reuses target connections. A zero field means its
// Default… (Compile fills them in).
type HTTPOptions struct {
	// HeaderTimeout bounds reading one request head, from its first byte;
	// exceeded: 408 and the connection closes.
	HeaderTimeout time.Duration
	// MaxHeaderBytes bounds a request head (request line and headers);
	// exceeded: 431 and the connection closes.
	MaxHeaderBytes int
	// KeepAliveIdle closes a client connection that has no request in
	// flight and sends no new one for this long.
	KeepAliveIdle time.Duration
	// MaxClients bounds the open client connections of the virtual server,
	// apart from the request limits: a connection over it gets the 503 page
	// (limit "maxClients") and is closed. An idle keep-alive connection
	// holds a client slot, never a request slot.
	MaxClients int64
	// BackendIdle closes a pooled target connection unused this long.
	BackendIdle time.Duration
	// MaxIdlePerTarget bounds the pooled (idle) connections per target.
	MaxIdlePerTarget int
	// Forwarded says which client-naming headers are added.
	Forwarded Forwarded
}

// resolve fills o's zero fields with the defaults and reports bad values.
func (o *HTTPOptions) resolve(bad func(string, ...any), where string) {
	d := func(p *time.Duration, v time.Duration, name string) {
		if *p == 0 {
			*p = v
		}
		if *p < 0 {
			bad("%s http: %s %v is negative", where, name, *p)
		}
	}
	d(&o.HeaderTimeout, DefaultHeaderTimeout, "headerTimeout")
	d(&o.KeepAliveIdle, DefaultKeepAliveIdle, "keepAliveIdle")
	d(&o.BackendIdle, DefaultBackendIdle, "backendIdle")
	if o.MaxHeaderBytes == 0 {
		o.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	if o.MaxHeaderBytes < 256 || o.MaxHeaderBytes > 1<<20 {
		bad("%s http: maxHeaderBytes %d is out of range 256..1048576", where, o.MaxHeaderBytes)
	}
	if o.MaxClients == 0 {
		o.MaxClients = DefaultMaxClients
	}
	if o.MaxClients < 0 {
		bad("%s http: maxClients %d is negative", where, o.MaxClients)
	}
	if o.MaxIdlePerTarget == 0 {
		o.MaxIdlePerTarget = DefaultMaxIdlePerTarget
	}
	if o.MaxIdlePerTarget < 0 {
		bad("%s http: maxIdlePerTarget %d is negative", where, o.MaxIdlePerTarget)
	}
	if int(o.Forwarded) >= len(forwardedNames) {
		bad("%s http: bad forwarded %v", where, o.Forwarded)
	}
}
