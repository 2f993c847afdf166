package proxy

// The 503 page: what a refused http client is sent, naming the limit that
// tripped and its value.

import (
	"bytes"
	"html"
	"net"
	"strconv"
	"time"
)

// DefaultRetryAfter is the 503's Retry-After where a Page503 leaves it zero.
const DefaultRetryAfter = 5 * time.Second

// Page503 is what the 503 page says.
type Page503 struct {
	// Limit names the limit that tripped, Value its configured value,
	// Reason a sentence; the page shows all three as given ("" Limit:
	// "unspecified"; "" Reason: a generic sentence).
	Limit  string
	Value  int64
	Reason string
	// Limits, when it names more than one, is every limit over, the first
	// one first: the page lists each (level, limit, value and the measured
	// statistic) and X-Weir-Limit names them all, comma-separated.
	Limits []PageLimit
	// RetryAfter is the page's Retry-After; zero means DefaultRetryAfter.
	RetryAfter time.Duration
}

// PageLimit is one limit a 503 page names: the level it is set at (`class
// "gold"`), its configuration name and value, and the statistic measured
// against it.
type PageLimit struct {
	Level    string
	Limit    string
	Value    int64
	Measured int64
}

// HalfCloser is a client connection the 503 page is served on: a net.Conn
// that can send its FIN and keep reading.
type HalfCloser interface {
	net.Conn
	CloseWrite() error
}

// maxRequestHead bounds how much of a refused HTTP request is read before
// the 503 is sent; the rest is discarded.
const maxRequestHead = 8 << 10

// DrainLimit bounds what is read and discarded after the 503, so that
// closing does not reset the connection (and lose the page) while the
// client is still sending.
const DrainLimit = 64 << 10

// Serve503 reads the start of an HTTP request (bounded in size and time),
// answers 503 Service Unavailable with a page naming the limit, half-closes,
// drains what the client still sends, and closes.
// It returns the request line it read (empty when none arrived) and the
// size of the response it wrote (0 when the write failed).
func Serve503(c HalfCloser, p Page503, timeout time.Duration) (requestLine string, sent int) {
	defer c.Close()
	deadline := time.Now().Add(timeout)
	_ = c.SetReadDeadline(deadline)
	buf := make([]byte, maxRequestHead)
	n := 0
	for n < len(buf) {
		m, err := c.Read(buf[n:])
		n += m
		if bytes.Contains(buf[:n], []byte("\r\n\r\n")) || bytes.Contains(buf[:n], []byte("\n\n")) || err != nil {
			break
		}
	}
	requestLine = RequestLine(buf[:n])
	_ = c.SetWriteDeadline(deadline.Add(timeout))
	page := p.Render("close")
	if _, err := c.Write(page); err != nil {
		return requestLine, 0
	}
	sent = len(page)
	_ = c.CloseWrite()
	_ = c.SetReadDeadline(time.Now().Add(timeout))
	for drained := 0; drained < DrainLimit; {
		m, err := c.Read(buf)
		drained += m
		if err != nil {
			break
		}
	}
	return requestLine, sent
}

// MaxRequestLine bounds the request line reported for the access log.
const MaxRequestLine = 1024

// RequestLine returns b's first line without its line end, printable ASCII
// only (anything else becomes '?'), at most MaxRequestLine bytes.
func RequestLine(b []byte) string {
	if i := bytes.IndexByte(b, '\n'); i >= 0 {
		b = b[:i]
	}
	b = bytes.TrimSuffix(b, []byte("\r"))
	if len(b) > MaxRequestLine {
		b = b[:MaxRequestLine]
	}
	out := []byte(string(b))
	for i, c := range out {
		if c < 0x20 || c > 0x7e {
			out[i] = '?'
		}
	}
	return string(out)
}

// Render renders the 503 response with the Connection field conn: "close",
// "keep-alive" (an HTTP/1.0 keep-alive connection that stays open) or ""
// (an HTTP/1.1 one that stays open).
func (d Page503) Render(conn string) []byte {
	retry := d.RetryAfter
	if retry <= 0 {
		retry = DefaultRetryAfter
	}
	secs := int64((retry + time.Second - 1) / time.Second)
	limit := d.Limit
	if limit == "" {
		limit = "unspecified"
	}
	reason := d.Reason
	if reason == "" {
		reason = "The service is at its limit."
	}
	var body bytes.Buffer
	body.WriteString("<!DOCTYPE html>\n<html><head><title>503 Service Unavailable</title></head><body>\n")
	body.WriteString("<h1>503 Service Unavailable</h1>\n<p>")
	body.WriteString(html.EscapeString(reason))
	header := sanitizeHeader(limit) + "=" + strconv.FormatInt(d.Value, 10)
	if len(d.Limits) > 1 {
		body.WriteString("</p>\n<p>Limits:</p>\n<ul>\n")
		header = ""
		for i, l := range d.Limits {
			body.WriteString("<li>")
			body.WriteString(html.EscapeString(l.Level))
			body.WriteString(": <b>")
			body.WriteString(html.EscapeString(l.Limit))
			body.WriteString("</b> = ")
			body.WriteString(strconv.FormatInt(l.Value, 10))
			body.WriteString(", measured ")
			body.WriteString(strconv.FormatInt(l.Measured, 10))
			body.WriteString("</li>\n")
			if i > 0 {
				header += ", "
			}
			header += sanitizeHeader(l.Limit) + "=" + strconv.FormatInt(l.Value, 10)
		}
		body.WriteString("</ul>\n<p>Retry after ")
	} else {
		body.WriteString("</p>\n<p>Limit: <b>")
		body.WriteString(html.EscapeString(limit))
		body.WriteString("</b> = ")
		body.WriteString(strconv.FormatInt(d.Value, 10))
		body.WriteString("</p>\n<p>Retry after ")
	}
	body.WriteString(strconv.FormatInt(secs, 10))
	body.WriteString(" s.</p>\n</body></html>\n")

	var b bytes.Buffer
	b.WriteString("HTTP/1.1 503 Service Unavailable\r\n")
	b.WriteString("Content-Type: text/html; charset=utf-8\r\n")
	b.WriteString("Retry-After: " + strconv.FormatInt(secs, 10) + "\r\n")
	b.WriteString("X-Weir-Limit: " + header + "\r\n")
	b.WriteString("Content-Length: " + strconv.Itoa(body.Len()) + "\r\n")
	if conn != "" {
		b.WriteString("Connection: " + conn + "\r\n")
	}
	b.WriteString("\r\n")
	b.Write(body.Bytes())
	return b.Bytes()
}

// sanitizeHeader keeps a header value on one line.
func sanitizeHeader(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c < 0x20 || c == 0x7f {
			b[i] = ' '
		}
	}
	return string(b)
}
