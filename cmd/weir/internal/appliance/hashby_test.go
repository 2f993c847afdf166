package appliance_test

import (
	"fmt"
	"net/http"
	"testing"

	"weir/cmd/weir/internal/lab"
	"weir/policy"
)

// TestHashByHeaderPerRequest: an http service hashing by X-User sends
// every request of one user to one target, over new connections and on
// one keep-alive connection carrying several users, whose requests spread
// over the targets (the pick is per request).
func TestHashByHeaderPerRequest(t *testing.T) {
	cfg := lab.WebConfig([]int{1, 1, 1, 1}, nil)
	cfg.Balancer.Algorithm = policy.Maglev
	by, err := policy.ParseHashBy("header:X-User")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Services[0].HashBy = &by
	l := lab.Must(t, cfg, lab.Options{})
	l.App.Start()
	if s := l.App.Status().Services[0]; s.Balancer != "maglev" || s.HashBy != "header:X-User" {
		t.Errorf("status: algorithm %q hash_by %q, want maglev, header:X-User", s.Balancer, s.HashBy)
	}
	get := func(c *http.Client, user string) string {
		t.Helper()
		req, _ := http.NewRequest("GET", "http://198.19.0.80/", nil)
		req.Header.Set("X-User", user)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("%s: status %d", user, resp.StatusCode)
		}
		return resp.Header.Get("X-Weir-Target")
	}
	fresh := &http.Client{Transport: &http.Transport{DialContext: l.Dial, DisableKeepAlives: true}}
	keep := &http.Transport{DialContext: l.Dial, MaxConnsPerHost: 1}
	defer keep.CloseIdleConnections()
	shared := &http.Client{Transport: keep}
	of := map[string]string{}
	targets := map[string]bool{}
	for round := range 3 {
		for u := range 12 {
			user := fmt.Sprintf("user-%d", u)
			for _, c := range []*http.Client{fresh, shared} {
				got := get(c, user)
				if round == 0 && of[user] == "" {
					of[user] = got
				} else if got != of[user] {
					t.Fatalf("%s reached %s, earlier %s", user, got, of[user])
				}
				targets[got] = true
			}
		}
	}
	if len(targets) < 3 {
		t.Errorf("12 users over one keep-alive connection reached only %v of 4 targets", targets)
	}
	t.Logf("users to targets: %v", of)
}
