package policy

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestCompileCluster(t *testing.T) {
	defer func(h func() (string, error)) { hostname = h }(hostname)
	hostname = func() (string, error) { return "box7", nil }
	c, err := Compile(&Config{Cluster: &Cluster{Redis: "r:1", Name: "e"}})
	if err != nil {
		t.Fatal(err)
	}
	if got := *c.Cluster; got != (Cluster{Redis: "r:1", Name: "e", Instance: "box7", LeaseInterval: DefaultLeaseInterval}) {
		t.Errorf("defaults: %+v", got)
	}
	if c, err := Compile(&Config{}); err != nil || c.Cluster != nil {
		t.Errorf("no cluster section: %v, %+v", err, c.Cluster)
	}

	hostname = func() (string, error) { return "", errors.New("no uts") }
	for _, tt := range []struct {
		cl   Cluster
		want string
	}{
		{Cluster{Name: "e", Instance: "i"}, "redis (an address or URL) is required"},
		{Cluster{Redis: "r:1", Instance: "i"}, "name is required"},
		{Cluster{Redis: "r:1", Name: "e"}, "host name is unknown (no uts)"},
		{Cluster{Redis: "r:1", Name: "e{", Instance: "i"}, "may not contain { or }"},
		{Cluster{Redis: "r:1", Name: "e", Instance: "i", LeaseInterval: time.Millisecond}, "leaseInterval 1ms is below 10ms"},
		{Cluster{Redis: "r:1", Name: "e", Instance: "i", OnRedisDown: 9}, "unknown onRedisDown redisdown(9)"},
	} {
		cl := tt.cl
		_, err := Compile(&Config{Cluster: &cl})
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%+v: error %v, want %q", tt.cl, err, tt.want)
		}
	}
}

func TestParseRedisDown(t *testing.T) {
	for d := LocalShare; d <= FailClosed; d++ {
		if got, err := ParseRedisDown(d.String()); err != nil || got != d {
			t.Errorf("%v: %v %v", d, got, err)
		}
	}
	if _, err := ParseRedisDown("localshare"); err == nil {
		t.Error("case-insensitive parse accepted")
	}
}
