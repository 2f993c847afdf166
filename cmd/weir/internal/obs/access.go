package obs

import (
	"bufio"
	"fmt"
	"io"
	"strconv"
	"sync"
	"time"

	"github.com/rs/zerolog"
)

// AccessRecord is one connection through weir, written when it ends.
type AccessRecord struct {
	Start  time.Time
	Client string // ip:port
	// Proxy is the outer load balancer's ip:port when a PROXY-protocol
	// header from it named Client; "" otherwise.
	Proxy   string
	VIP     string // ip:port
	Service string
	// ServerName is a tls service's ClientHello server name (lower case;
	// "" when none was sent, or for another protocol).
	ServerName string
	Target     string // name, or "" when refused
	BytesIn    uint64 // client → target
	BytesOut   uint64 // target → client
	Duration   time.Duration
	// Outcome is how the connection ended, proxy.Outcome's String: "ok"
	// (served), "idle" (closed by the idle timeout), "reset" (refused with
	// RST), "503" (refused with the page), "aborted" (weir shut down),
	// "target-timeout" (the target sent nothing within the first-byte
	// timeout), "panic", "bad-gateway" (an http target failed mid-response)
	// or "client-error" (an http client's malformed or stalled body). A
	// client that never completes its handshake has no record: the
	// forwarder counts it (weir_forwarder_handshake_*).
	Outcome string
	// Reason says why a connection was refused (the limit that tripped) or
	// why it failed (the handshake's or the aborted dial's error).
	Reason string
	// RequestLine and Status are set for HTTP refusals answered with a page.
	RequestLine string
	Status      int
	// QueueWait is how long the connection (request) waited in a limit's
	// queue before it was admitted or refused; 0: it did not queue.
	QueueWait time.Duration
}

// AccessLog writes one line per connection: JSON by default, Common Log
// Format when CLF is set. Writes are serialised and buffered; Flush or Close
// pushes them out.
type AccessLog struct {
	mu  sync.Mutex
	w   *bufio.Writer
	clf bool
	zl  zerolog.Logger
}

// NewAccessLog writes to w, in Common Log Format when clf is true.
func NewAccessLog(w io.Writer, clf bool) *AccessLog {
	a := &AccessLog{w: bufio.NewWriterSize(w, 64<<10), clf: clf}
	a.zl = zerolog.New(a.w)
	return a
}

// Log writes r.
func (a *AccessLog) Log(r AccessRecord) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.clf {
		a.w.WriteString(CLF(r))
		a.w.WriteByte('\n')
		return
	}
	e := a.zl.Log().Time("time", r.Start).Str("client", r.Client).Str("vip", r.VIP).
		Str("service", r.Service).Str("target", r.Target)
	if r.ServerName != "" {
		e = e.Str("sni", r.ServerName)
	}
	e = e.
		Uint64("bytes_in", r.BytesIn).Uint64("bytes_out", r.BytesOut).
		Dur("duration_ms", r.Duration).Str("outcome", r.Outcome)
	if r.Proxy != "" {
		e = e.Str("proxy", r.Proxy)
	}
	if r.Reason != "" {
		e = e.Str("reason", r.Reason)
	}
	if r.RequestLine != "" {
		e = e.Str("request", r.RequestLine).Int("status", r.Status)
	}
	if r.QueueWait > 0 {
		e = e.Dur("queue_wait_ms", r.QueueWait)
	}
	e.Send()
}

// Flush writes buffered lines.
func (a *AccessLog) Flush() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.w.Flush()
}

// CLF formats r in Common Log Format: host ident user [time] "request" status
// bytes, then two fields of weir's own, the target ("-" when none served it)
// and the duration in microseconds (Apache's %D), which CLF readers that
// stop after the bytes ignore. A plain TCP connection's request is
// "TCP <vip> <target>" and its status its outcome's HTTP-like code (200
// served, 503 refused, 408 a handshake the client did not complete, 500
// aborted). A tls service's is "TLS <vip> <server name> <target>" ("-"
// for none).
func CLF(r AccessRecord) string {
	host := r.Client
	if h, _, ok := cutPort(host); ok {
		host = h
	}
	req := r.RequestLine
	status := r.Status
	if req == "" {
		req = fmt.Sprintf("TCP %s %s", r.VIP, orDash(r.Target))
		if r.ServerName != "" {
			req = fmt.Sprintf("TLS %s %s %s", r.VIP, r.ServerName, orDash(r.Target))
		}
		switch r.Outcome {
		case "ok", "idle":
			status = 200
		case "503", "reset":
			status = 503
		case "target-timeout":
			status = 504
		case "bad-gateway":
			status = 502
		case "client-error":
			status = 400
		default:
			status = 500
		}
	}
	line := fmt.Sprintf("%s - - [%s] %q %d %s %q %d", host, r.Start.Format("02/Jan/2006:15:04:05 -0700"),
		req, status, strconv.FormatUint(r.BytesOut, 10), orDash(r.Target), r.Duration.Microseconds())
	if r.QueueWait > 0 {
		// A fourth field of weir's own, only for a connection that
		// queued: the queue wait in microseconds.
		line += " queue=" + strconv.FormatInt(r.QueueWait.Microseconds(), 10)
	}
	return line
}

func cutPort(hostport string) (host, port string, ok bool) {
	for i := len(hostport) - 1; i >= 0; i-- {
		if hostport[i] == ':' {
			h := hostport[:i]
			if len(h) > 1 && h[0] == '[' && h[len(h)-1] == ']' {
				h = h[1 : len(h)-1]
			}
			return h, hostport[i+1:], true
		}
	}
	return hostport, "", false
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
