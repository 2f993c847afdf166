package config

import (
	"os"
	"testing"
	"time"

	"weir/policy"
)

func TestParseYAMLCluster(t *testing.T) {
	host, _ := os.Hostname()
	tests := []struct {
		name string
		text string
		want *policy.Cluster
	}{
		{"absent: a single instance", "instance: {name: a}\n", nil},
		{"defaults", "cluster: {redis: 127.0.0.1:6379, name: edge}\n",
			&policy.Cluster{Redis: "127.0.0.1:6379", Name: "edge", Instance: host,
				LeaseInterval: policy.DefaultLeaseInterval, OnRedisDown: policy.LocalShare, BorrowTimeout: policy.DefaultBorrowTimeout}},
		{"everything", `
cluster:
  redis: redis://u:p@redis.example:6380/2
  name: edge
  instance: weir-b
  leaseInterval: 250ms
  onRedisDown: failClosed
  borrowTimeout: 20ms
`, &policy.Cluster{Redis: "redis://u:p@redis.example:6380/2", Name: "edge", Instance: "weir-b",
			LeaseInterval: 250 * time.Millisecond, OnRedisDown: policy.FailClosed, BorrowTimeout: 20 * time.Millisecond}},
		{"failOpen, IPv6", "cluster: {redis: \"[::1]:6379\", name: e, instance: i, onRedisDown: failOpen}\n",
			&policy.Cluster{Redis: "[::1]:6379", Name: "e", Instance: "i", LeaseInterval: time.Second, OnRedisDown: policy.FailOpen, BorrowTimeout: policy.DefaultBorrowTimeout}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := noFiles.ParseYAML("t.yaml", []byte(tt.text))
			if err != nil {
				t.Fatalf("ParseYAML: %v", err)
			}
			switch {
			case tt.want == nil && c.Cluster != nil:
				t.Errorf("cluster %+v, want none", *c.Cluster)
			case tt.want != nil && (c.Cluster == nil || *c.Cluster != *tt.want):
				t.Errorf("cluster %+v, want %+v", c.Cluster, *tt.want)
			}
		})
	}
}

func TestParseYAMLClusterErrors(t *testing.T) {
	tests := []struct{ name, text, want string }{
		{"no redis", "cluster: {name: e}\n", `t.yaml:1:10: cluster: missing "redis"`},
		{"no name", "cluster: {redis: a:1}\n", `t.yaml:1:10: cluster: missing "name"`},
		{"bad address", "cluster: {redis: localhost, name: e}\n",
			`t.yaml:1:18: redis: "localhost": want host:port or a redis:// URL`},
		{"bad port", "cluster: {redis: \"a:99999\", name: e}\n", `t.yaml:1:18: redis: "a:99999": port must be 1..65535`},
		{"bad scheme", "cluster: {redis: \"http://a:1\", name: e}\n", `t.yaml:1:18: redis: URL scheme "http": want redis or rediss`},
		{"hash tag in name", "cluster: {redis: a:1, name: \"e{x}\"}\n",
			`t.yaml:1:29: name: "e{x}": spaces, control characters and { } are not allowed`},
		{"space in instance", "cluster: {redis: a:1, name: e, instance: \"a b\"}\n",
			`t.yaml:1:42: instance: "a b": spaces, control characters and { } are not allowed`},
		{"lease too short", "cluster: {redis: a:1, name: e, leaseInterval: 1ms}\n",
			`t.yaml:1:47: leaseInterval: 1ms is out of range 10ms..1m`},
		{"borrow beyond half a lease", "cluster: {redis: a:1, name: e, leaseInterval: 20ms, borrowTimeout: 15ms}\n",
			`t.yaml: cluster: borrowTimeout 15ms is out of range 0..leaseInterval/2 (10ms)`},
		{"zero lease", "cluster: {redis: a:1, name: e, leaseInterval: 0s}\n",
			`t.yaml:1:47: leaseInterval: must be more than 0`},
		{"unknown fallback", "cluster: {redis: a:1, name: e, onRedisDown: panic}\n",
			`t.yaml:1:45: onRedisDown: unknown onRedisDown "panic" (want localShare, failOpen or failClosed)`},
		{"unknown key", "cluster: {redis: a:1, name: e, leaseIntrval: 1s}\n",
			`t.yaml:1:32: unknown key "leaseIntrval" in cluster (did you mean "leaseInterval"?)`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := noFiles.ParseYAML("t.yaml", []byte(tt.text))
			if err == nil {
				t.Fatalf("no error, want %q", tt.want)
			}
			if err.Error() != tt.want {
				t.Errorf("error\n got: %s\nwant: %s", err, tt.want)
			}
		})
	}
}
