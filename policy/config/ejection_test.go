package config

import (
	"strings"
	"testing"
	"time"

	"weir/policy"
)

func TestParseErrorFractionAndEjection(t *testing.T) {
	text := `
monitor: {errorRatioAndWeightFr: [50, 25], errorMaxWeightFr: 75, errorMinResponses: 40, errorCountsFailures: true}
balancer: {ejection: {consecutiveFailures: 5, for: 10s, maxPercent: 34, serverErrors: true}}
services:
  - {name: web, protocol: http, vips: [198.18.0.1], port: 80, targets: [{address: 198.18.1.1:80}]}
`
	c, err := noFiles.ParseYAML("t.yaml", []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	m := c.Monitor
	if m.ErrorThreshold != 50 || m.ErrorStep != 25 || m.ErrorMax != 75 || m.MinResponses != 40 || !m.ErrorCountsFailures {
		t.Errorf("monitor error part %+v", m)
	}
	if e := c.Balancer.Ejection; e != (policy.Ejection{ConsecutiveFailures: 5, For: 10 * time.Second, MaxPercent: 34, ServerErrors: true}) {
		t.Errorf("ejection %+v", e)
	}
	// Defaults: the error part off; ejection's for and maxPercent filled.
	c, err = noFiles.ParseYAML("t.yaml", []byte("balancer: {ejection: {consecutiveFailures: 3}}\nservices:\n  - {name: a, vips: [198.18.0.1], port: 80, targets: [{address: 198.18.1.1:80}]}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Monitor.ErrorThreshold != 0 || c.Monitor.ErrorStep != 0 {
		t.Errorf("error part on by default: %+v", c.Monitor)
	}
	if e := c.Balancer.Ejection; e != (policy.Ejection{ConsecutiveFailures: 3, For: policy.DefaultEjectionFor, MaxPercent: policy.DefaultEjectionMaxPercent}) {
		t.Errorf("ejection defaults %+v", e)
	}
	for _, tt := range []struct{ name, text, want string }{
		{"no failures", "balancer: {ejection: {for: 10s}}\n", "consecutiveFailures"},
		{"percent", "balancer: {ejection: {consecutiveFailures: 5, maxPercent: 101}}\n", "maxPercent"},
		{"for", "balancer: {ejection: {consecutiveFailures: 5, for: 0s}}\n", "for"},
		{"unknown key", "balancer: {ejection: {consecutiveFailures: 5, on5xx: true}}\n", "on5xx"},
		{"error pair", "monitor: {errorRatioAndWeightFr: [50]}\n", "errorRatioAndWeightFr"},
		{"error max", "monitor: {errorMaxWeightFr: 0}\n", "errorMaxWeightFr"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := noFiles.ParseYAML("t.yaml", []byte(tt.text))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %v, want %q", err, tt.want)
			}
		})
	}
}
