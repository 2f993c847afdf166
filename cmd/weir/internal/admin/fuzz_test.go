package admin

import (
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"weir/cmd/weir/api"
)

const fuzzToken = "s3cret"

// secretSource's status carries a marker that must never reach a client
// without the token.
type secretSource struct{}

func (secretSource) Status() api.Status { return api.Status{Instance: "marker-7f3a"} }
func (secretSource) Connections() []api.Connection {
	return []api.Connection{{Service: "marker-7f3a"}}
}
func (secretSource) Healthy() error { return nil }

// FuzzHandler sends the admin API arbitrary methods, paths, queries and
// Authorization headers. Whatever comes in, the handler does not panic,
// nothing but /healthz answers without the token, and a request with the
// token for /status gets a document that decodes as api.Status.
func FuzzHandler(f *testing.F) {
	for _, s := range [][4]string{
		{"GET", "/status", "", "Bearer " + fuzzToken},
		{"GET", "/status", "", ""},
		{"GET", "/status", "", "Bearer " + fuzzToken + " "},
		{"GET", "/status", "", "bearer " + fuzzToken},
		{"GET", "/healthz", "", ""},
		{"POST", "/healthz", "", ""},
		{"GET", "/metrics", "format=x", "Bearer"},
		{"GET", "//status/../status", "", ""},
		{"GET", "/connections", "a=%zz", "Bearer " + fuzzToken},
		{"DELETE", "/", "", "Basic Zm9vOmJhcg=="},
		{"GET", "/debug/pprof/", "", "Bearer " + fuzzToken},
		{"GET", "/healthz/", "", ""},
		{"GET", "/%00", "", "Bearer \x00"},
	} {
		f.Add(s[0], s[1], s[2], s[3])
	}
	reg := prometheus.NewRegistry()
	h := Handler(Options{Token: fuzzToken}, secretSource{}, reg)
	f.Fuzz(func(t *testing.T, method, path, query, auth string) {
		if method == "" || strings.ContainsAny(method, " \t\r\n") {
			method = "GET"
		}
		if !strings.HasPrefix(path, "/") {
			path = "/" + path
		}
		r := &http.Request{
			Method:     method,
			URL:        &url.URL{Path: path, RawQuery: query},
			Header:     http.Header{},
			Proto:      "HTTP/1.1",
			ProtoMajor: 1, ProtoMinor: 1,
			Host:       "127.0.0.1:9090",
			RemoteAddr: "127.0.0.1:40000",
			RequestURI: path,
		}
		if auth != "" {
			r.Header.Set("Authorization", auth)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		body := w.Body.String()
		authed := auth == "Bearer "+fuzzToken
		healthz := path == "/healthz" && (method == "GET" || method == "HEAD")
		switch {
		case !authed && !healthz:
			if w.Code == http.StatusOK || strings.Contains(body, "marker-7f3a") {
				t.Fatalf("%s %q without the token (Authorization %q): %d %q", method, path, auth, w.Code, body)
			}
			if w.Code != http.StatusUnauthorized && w.Code/100 != 3 {
				t.Fatalf("%s %q without the token: %d, want 401 or a redirect", method, path, w.Code)
			}
		case authed && method == "GET" && path == "/status":
			var st api.Status
			if w.Code != http.StatusOK || json.Unmarshal(w.Body.Bytes(), &st) != nil || st.Instance != "marker-7f3a" {
				t.Fatalf("GET /status with the token: %d %q", w.Code, body)
			}
		case healthz:
			if w.Code != http.StatusOK {
				t.Fatalf("%s /healthz: %d", method, w.Code)
			}
		}
	})
}

// FuzzCheckAddr: CheckAddr never panics, and it lets a tokenless address
// through only when its host is loopback.
func FuzzCheckAddr(f *testing.F) {
	for _, s := range []string{"127.0.0.1:9090", "[::1]:9090", "localhost:1", "0.0.0.0:9090", "[::]:80", ":9090", "127.0.0.1", "[::ffff:127.0.0.1]:1", "nonsense"} {
		f.Add(s, "")
		f.Add(s, "t")
	}
	f.Fuzz(func(t *testing.T, addr, token string) {
		err := CheckAddr(addr, token)
		if err != nil || token != "" {
			return
		}
		host, _, serr := net.SplitHostPort(addr)
		if serr != nil {
			t.Fatalf("CheckAddr(%q) accepted an address that does not split: %v", addr, serr)
		}
		if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
			t.Fatalf("CheckAddr(%q, no token) = nil for a non-loopback host %q", addr, host)
		}
	})
}
