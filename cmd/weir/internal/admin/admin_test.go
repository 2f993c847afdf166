package admin

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"weir/cmd/weir/api"
)

type fakeSource struct{ down error }

func (f fakeSource) Status() api.Status {
	return api.Status{Instance: "lab", Services: []api.Service{{Name: "web"}}}
}
func (f fakeSource) Connections() []api.Connection { return []api.Connection{} }
func (f fakeSource) Healthy() error                { return f.down }

func TestCheckAddr(t *testing.T) {
	for _, tc := range []struct {
		addr, token string
		ok          bool
	}{
		{"127.0.0.1:9090", "", true},
		{"[::1]:9090", "", true},
		{"localhost:9090", "", true},
		{"0.0.0.0:9090", "", false},
		{"198.18.0.1:9090", "", false},
		{"198.18.0.1:9090", "s3cret", true},
		{"nonsense", "", false},
	} {
		err := CheckAddr(tc.addr, tc.token)
		if (err == nil) != tc.ok {
			t.Errorf("CheckAddr(%q, %q) = %v, want ok=%v", tc.addr, tc.token, err, tc.ok)
		}
		// The refusal names the flag and variable that fix it, not config
		// keys that do not exist.
		if err != nil && tc.addr != "nonsense" && !strings.Contains(err.Error(), "--admin-token or $WEIR_ADMIN_TOKEN") {
			t.Errorf("CheckAddr(%q) error %q does not name --admin-token", tc.addr, err)
		}
	}
}

func serve(t *testing.T, opts Options, src Source) string {
	t.Helper()
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "weir_test_total", Help: "test"})
	reg.MustRegister(c)
	c.Add(3)
	opts.Addr = "127.0.0.1:0"
	s, err := Listen(opts, src, reg)
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve()
	t.Cleanup(func() { s.Shutdown(context.Background()) })
	return "http://" + s.Addr()
}

func get(t *testing.T, url, token string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestEndpoints(t *testing.T) {
	base := serve(t, Options{}, fakeSource{})
	for _, tc := range []struct {
		path string
		code int
		want string
	}{
		{"/status", 200, `"web"`},
		{"/connections", 200, "[]"},
		{"/metrics", 200, "weir_test_total 3"},
		{"/healthz", 200, "ok"},
		{"/debug/pprof/", 404, ""},
	} {
		code, body := get(t, base+tc.path, "")
		if code != tc.code || !strings.Contains(body, tc.want) {
			t.Errorf("GET %s = %d %q, want %d containing %q", tc.path, code, body, tc.code, tc.want)
		}
	}
}

func TestTokenAndPprof(t *testing.T) {
	base := serve(t, Options{Token: "s3cret", Pprof: true}, fakeSource{down: errors.New("draining")})
	if code, _ := get(t, base+"/status", ""); code != 401 {
		t.Errorf("no token: %d, want 401", code)
	}
	if code, _ := get(t, base+"/status", "wrong"); code != 401 {
		t.Errorf("wrong token: %d, want 401", code)
	}
	if code, _ := get(t, base+"/status", "s3cret"); code != 200 {
		t.Errorf("token: %d, want 200", code)
	}
	if code, _ := get(t, base+"/debug/pprof/", "s3cret"); code != 200 {
		t.Errorf("pprof: %d, want 200", code)
	}
	if code, body := get(t, base+"/healthz", ""); code != 503 || !strings.Contains(body, "draining") {
		t.Errorf("healthz while unhealthy: %d %q", code, body)
	}
}

func TestListenAddressInUse(t *testing.T) {
	base := serve(t, Options{}, fakeSource{})
	_, err := Listen(Options{Addr: strings.TrimPrefix(base, "http://")}, fakeSource{}, prometheus.NewRegistry())
	if err == nil || !strings.Contains(err.Error(), "in use") || !strings.Contains(err.Error(), "--admin HOST:PORT") {
		t.Fatalf("second listen: %v, want an address-in-use error naming --admin", err)
	}
}

// TestHistoryAndPage: with a history, /history and the status page are
// served behind the same token as the rest; without one they are absent.
func TestHistoryAndPage(t *testing.T) {
	hist := func() api.History {
		return api.History{Capacity: 9, Targets: []api.TargetSeries{{Service: "web", Target: "t1", At: []int64{1000}, Weight: []int{4}, Effective: []int{2}}}}
	}
	base := serve(t, Options{Token: "s3cret", History: hist}, fakeSource{})
	for _, tc := range []struct{ path, want string }{
		{"/history", `"capacity": 9`},
		{"/ui", `id="weight-web-t1"`},
		{"/ui/charts", `data-series="effective"`},
		{"/ui/ui.js", "fetch("},
		{"/ui/ui.css", "figure.chart"},
	} {
		if code, _ := get(t, base+tc.path, ""); code != 401 {
			t.Errorf("GET %s without the token: %d, want 401", tc.path, code)
		}
		if code, body := get(t, base+tc.path, "s3cret"); code != 200 || !strings.Contains(body, tc.want) {
			t.Errorf("GET %s = %d, want 200 containing %q:\n%.300s", tc.path, code, tc.want, body)
		}
	}
	plain := serve(t, Options{}, fakeSource{})
	for _, p := range []string{"/history", "/ui"} {
		if code, _ := get(t, plain+p, ""); code != 404 {
			t.Errorf("GET %s without a history: %d, want 404", p, code)
		}
	}
}

// TestPageLogin: a browser signs in with the token at /ui/login and its
// cookie then opens the page; a wrong token gets no cookie.
func TestPageLogin(t *testing.T) {
	base := serve(t, Options{Token: "s3cret", History: func() api.History { return api.History{} }}, fakeSource{})
	if code, body := get(t, base+"/ui/login", ""); code != 200 || !strings.Contains(body, `name="token"`) {
		t.Fatalf("login page: %d %q", code, body)
	}
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := noRedirect.PostForm(base+"/ui/login", url.Values{"token": {"wrong"}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 401 || len(resp.Cookies()) != 0 {
		t.Errorf("wrong token: %d, cookies %v", resp.StatusCode, resp.Cookies())
	}
	resp, err = noRedirect.PostForm(base+"/ui/login", url.Values{"token": {"s3cret"}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther || len(resp.Cookies()) != 1 || !resp.Cookies()[0].HttpOnly {
		t.Fatalf("sign in: %d, cookies %v", resp.StatusCode, resp.Cookies())
	}
	for _, c := range []struct {
		value string
		code  int
	}{{"s3cret", 200}, {"wrong", 401}} {
		req, _ := http.NewRequest("GET", base+"/ui", nil)
		req.AddCookie(&http.Cookie{Name: tokenCookie, Value: c.value})
		r, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		r.Body.Close()
		if r.StatusCode != c.code {
			t.Errorf("cookie %q: %d, want %d", c.value, r.StatusCode, c.code)
		}
	}
}
