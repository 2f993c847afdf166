package proxy

import (
	"bytes"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestRequestLine(t *testing.T) {
	for in, want := range map[string]string{
		"GET / HTTP/1.1\r\nHost: x\r\n\r\n": "GET / HTTP/1.1",
		"GET /a\x00b HTTP/1.0\n":            "GET /a?b HTTP/1.0",
		"":                                  "",
		"no line end":                       "no line end",
	} {
		if got := RequestLine([]byte(in)); got != want {
			t.Errorf("RequestLine(%q) = %q, want %q", in, got, want)
		}
	}
	if got := RequestLine(bytes.Repeat([]byte("a"), 5000)); len(got) != MaxRequestLine {
		t.Errorf("long line kept %d bytes", len(got))
	}
}

// TestPage503Render: the page names the limit and value, escapes the
// reason in HTML, keeps the X-Weir-Limit header on one line, rounds
// Retry-After up to whole seconds (DefaultRetryAfter when unset) and writes
// the Connection field asked for.
func TestPage503Render(t *testing.T) {
	for _, tc := range []struct {
		name string
		p    Page503
		conn string
		want []string
		not  []string
	}{
		{"defaults", Page503{}, "close",
			[]string{"HTTP/1.1 503 Service Unavailable\r\n", "Retry-After: 5\r\n", "X-Weir-Limit: unspecified=0\r\n", "Connection: close\r\n", "The service is at its limit."}, nil},
		{"named limit", Page503{Limit: "maxConnections", Value: 42, Reason: "Too many <connections>.", RetryAfter: 1500 * time.Millisecond}, "",
			[]string{"Retry-After: 2\r\n", "X-Weir-Limit: maxConnections=42\r\n", "Too many &lt;connections&gt;.", "<b>maxConnections</b> = 42"}, []string{"Connection:"}},
		// Sun: "an error page stating which limits caused the 503 error and
		// the value of the statistic that triggered the limit": every one.
		{"every limit over", Page503{Limit: "maxBandwidth", Value: 100, Limits: []PageLimit{
			{`class "gold"`, "maxBandwidth", 100, 200}, {`class "gold"`, "maxConnections", 1, 1}, {`instance "weir"`, "maxConnections", 3, 3}}}, "close",
			[]string{"X-Weir-Limit: maxBandwidth=100, maxConnections=1, maxConnections=3\r\n",
				"<li>class &#34;gold&#34;: <b>maxBandwidth</b> = 100, measured 200</li>",
				"<li>class &#34;gold&#34;: <b>maxConnections</b> = 1, measured 1</li>",
				"<li>instance &#34;weir&#34;: <b>maxConnections</b> = 3, measured 3</li>"}, []string{"\nSet-Cookie"}},
		{"header injection", Page503{Limit: "a\r\nSet-Cookie: x"}, "keep-alive",
			[]string{"X-Weir-Limit: a  Set-Cookie: x=0\r\n", "Connection: keep-alive\r\n"}, []string{"\nSet-Cookie"}},
	} {
		got := string(tc.p.Render(tc.conn))
		for _, w := range tc.want {
			if !strings.Contains(got, w) {
				t.Errorf("%s: page lacks %q:\n%s", tc.name, w, got)
			}
		}
		head, body, ok := strings.Cut(got, "\r\n\r\n")
		for _, w := range tc.not {
			if strings.Contains(head, w) {
				t.Errorf("%s: header has %q:\n%s", tc.name, w, head)
			}
		}
		if !ok || !strings.Contains(head+"\r\n", "Content-Length: "+strconv.Itoa(len(body))+"\r\n") {
			t.Errorf("%s: Content-Length does not match the body of %d bytes:\n%s", tc.name, len(body), head)
		}
	}
}
