package proxy

import (
	"bytes"
	"net/http"
)

// Unservable returns the status weir answers (and closes on) for a request
// head net/http parsed but a reverse proxy of HTTP/1.x must not forward,
// or 0 for a request to serve. head is the raw head, through its blank
// line. What net/http's server refuses and its ReadRequest lets through:
//
//   - a folded header line (obs-fold, RFC 9112 §5.2: a line of the head
//     that starts with a space or a tab): 400. net/http joins it, so a
//     "Transfer-Encoding:\r\n chunked" would be read as chunked by weir and
//     perhaps as something else by whatever is behind the target;
//   - an HTTP/1.1 request without a Host, or a Host that is not a valid
//     host (RFC 9112 §3.2): 400 (ReadRequest refuses two);
//   - any version but 1.x (HTTP/2.0 on a request line, the HTTP/2 client
//     preface "PRI * HTTP/2.0"): 505;
//   - CONNECT: 501. Forwarded, a target's 200 would make the connection a
//     tunnel that weir then read as requests.
func Unservable(in *http.Request, head []byte) int {
	if i := bytes.IndexByte(head, '\n'); i >= 0 {
		for _, l := range bytes.Split(head[i+1:], []byte("\n")) {
			if len(l) > 0 && (l[0] == ' ' || l[0] == '\t') {
				return http.StatusBadRequest
			}
		}
	}
	if in.ProtoMajor != 1 {
		return http.StatusHTTPVersionNotSupported
	}
	if in.Method == http.MethodConnect {
		return http.StatusNotImplemented
	}
	// ReadRequest refuses a second Host and moves the one into in.Host
	// (the absolute-form's authority wins over it).
	if (in.ProtoAtLeast(1, 1) && in.Host == "") || !validHost(in.Host) {
		return http.StatusBadRequest
	}
	return 0
}

// validHost is httpguts.ValidHostHeader (x/net, which this package does
// not import) less the comma: the bytes of a host, an IP literal in
// brackets and a port (RFC 3986's reg-name, IP-literal and port), and
// nothing else: no space, control byte, '/', '@' or list of hosts.
func validHost(h string) bool {
	for i := 0; i < len(h); i++ {
		c := h[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case bytes.IndexByte([]byte("!$%&'()*+-.:;=[]_~"), c) >= 0:
		default:
			return false
		}
	}
	return true
}
