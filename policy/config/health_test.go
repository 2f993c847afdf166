package config

import (
	"strings"
	"testing"
	"time"

	"weir/policy"
)

func TestParseHealthProbes(t *testing.T) {
	text := `
balancer:
  healthCheck:
    interval: 2s
    fall: 4
    http: {path: /healthz, host: www.example.com, expectStatus: "200-204"}
services:
  - name: web
    vips: [198.18.0.1]
    port: 80
    targets: [{address: 198.18.1.1:80}]
  - name: smtp
    vips: [198.18.0.1]
    port: 25
    healthCheck: {rise: 5, send: "EHLO weir\r\n", expect: {regexp: "^220 .*ESMTP"}}
    targets: [{address: 198.18.1.1:25}]
  - name: redis
    vips: [198.18.0.1]
    port: 6379
    healthCheck: {interval: 1s, send: "PING\r\n", expect: "+PONG"}
    targets: [{address: 198.18.1.1:6379}]
  - name: plain
    vips: [198.18.0.1]
    port: 22
    healthCheck: {timeout: 500ms}
    targets: [{address: 198.18.1.1:22}]
`
	c, err := noFiles.ParseYAML("t.yaml", []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	web := c.ServiceByName("web").Health
	want := policy.HTTPCheck{Method: "GET", Path: "/healthz", Host: "www.example.com", Status: policy.StatusRange{Lo: 200, Hi: 204}}
	if web.HTTP == nil || *web.HTTP != want || web.Interval != 2*time.Second || web.Timeout != time.Second || web.Fall != 4 || web.Rise != policy.DefaultHealthRise {
		t.Errorf("web (the balancer's) = %+v http %+v", web, web.HTTP)
	}
	smtp := c.ServiceByName("smtp").Health
	if smtp.HTTP != nil || smtp.Send != "EHLO weir\r\n" || smtp.ExpectRegexp == nil || !smtp.ExpectRegexp.MatchString("220 mx ESMTP ready") ||
		smtp.Rise != 5 || smtp.Fall != 4 || smtp.Interval != 2*time.Second || smtp.Timeout != time.Second {
		t.Errorf("smtp = %+v", smtp)
	}
	redis := c.ServiceByName("redis").Health
	if redis.Expect != "+PONG" || redis.Send != "PING\r\n" || redis.Interval != time.Second || redis.Timeout != 500*time.Millisecond {
		t.Errorf("redis = %+v", redis)
	}
	plain := c.ServiceByName("plain").Health
	if plain.HasProbe() || plain.Timeout != 500*time.Millisecond || plain.Interval != 2*time.Second {
		t.Errorf("plain = %+v", plain)
	}
	// The defaults: GET, /, 200-399.
	c, err = noFiles.ParseYAML("t.yaml", []byte("balancer: {healthCheck: {interval: 1s, http: {}}}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if h := c.Balancer.Health.HTTP; h == nil || *h != (policy.HTTPCheck{Method: "GET", Path: "/", Status: policy.StatusRange{Lo: 200, Hi: 399}}) {
		t.Errorf("defaults = %+v", h)
	}
}

func TestParseHealthErrors(t *testing.T) {
	hc := func(s string) string { return "balancer: {healthCheck: {interval: 2s, " + s + "}}\n" }
	svc := func(s string) string {
		return "balancer: {healthCheck: {interval: 2s}}\nservices:\n  - {name: a, vips: [198.18.0.1], port: 80, targets: [{address: 198.18.1.1:80}], healthCheck: {" + s + "}}\n"
	}
	tests := []struct{ name, text, want string }{
		{"status reversed", hc(`http: {expectStatus: "399-200"}`), `t.yaml:1:61: expectStatus: status range "399-200": 200 is below 399`},
		{"status out of range", hc(`http: {expectStatus: "200-700"}`), `"700" is not a status code 100..599`},
		{"status not a number", hc(`http: {expectStatus: "2xx"}`), `"2xx" is not a status code 100..599`},
		{"status open range", hc(`http: {expectStatus: "200-"}`), `"" is not a status code 100..599`},
		{"path without slash", hc(`http: {path: healthz}`), `path: want a path starting with / without spaces, got "healthz"`},
		{"method with space", hc(`http: {method: "GET /x"}`), `method: want a method such as GET or HEAD, got "GET /x"`},
		{"bad regexp", hc(`expect: {regexp: "a(b"}`), "t.yaml:1:57: regexp: bad regular expression: error parsing regexp: missing closing ): `a(b`"},
		{"regexp mapping without regexp", hc(`expect: {}`), `expect: missing "regexp"`},
		{"http and send", hc(`http: {}, send: "x"`), `http: a check is http or send/expect, not both`},
		{"unknown key", hc(`expct: "x"`), `unknown key "expct" in healthCheck (did you mean "expect"?)`},
		{"service timeout not below the inherited interval", svc(`timeout: 3s`), `virtual server "a" health check timeout 3s must be shorter than interval 2s`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := noFiles.ParseYAML("t.yaml", []byte(tt.text))
			if err == nil {
				t.Fatalf("no error, want %q", tt.want)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error\n got: %s\nwant: %s", err, tt.want)
			}
		})
	}
}

func TestCompileHealthErrors(t *testing.T) {
	for _, tt := range []struct {
		name string
		h    policy.HealthCheck
		want string
	}{
		{"status range", policy.HealthCheck{Interval: time.Second, HTTP: &policy.HTTPCheck{Status: policy.StatusRange{Lo: 400, Hi: 300}}}, "status range 400-300"},
		{"http and expect", policy.HealthCheck{Interval: time.Second, HTTP: &policy.HTTPCheck{}, Expect: "x"}, "http and send/expect both set"},
		{"path", policy.HealthCheck{Interval: time.Second, HTTP: &policy.HTTPCheck{Path: "x y"}}, `http path "x y" must start with /`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := &policy.Config{Balancer: policy.BalancerSettings{Health: tt.h}}
			_, err := policy.Compile(c)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Compile = %v, want %q", err, tt.want)
			}
		})
	}
}
