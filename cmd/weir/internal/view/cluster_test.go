package view

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"weir/cmd/weir/api"
)

// TestWriteCluster: weir status shows the cluster: Redis and the mode, the
// members with their age, each shared limit cluster-wide and here (a
// target's named with its service), the shared bandwidth and the sample
// exchange; nothing without a cluster section.
func TestWriteCluster(t *testing.T) {
	st := api.Status{Instance: "a", Cluster: &api.Cluster{
		Name: "lab", Instance: "a", Redis: "127.0.0.1:6379", Reachable: false, Mode: "localShare",
		LastError: "dial tcp: connection refused", Outages: 1, Renewals: 42,
		Members: []api.ClusterMember{{ID: "a", Started: time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC), SeenSeconds: 0.25},
			{ID: "b", Started: time.Date(2026, 12, 1, 12, 0, 1, 0, time.UTC), SeenSeconds: 1.5}},
		Levels: []api.ClusterLevel{{Level: "virtual server", Name: "web", Limit: 10, Share: 3, Open: 2, Held: 9, Refused: 7},
			{Level: "target", Name: "app1", Service: "web", Limit: 4, Share: 1, Open: 1, Held: 4}},
		Bandwidth:    []api.ClusterBandwidth{{Level: "virtual server", Name: "web", Max: 2 << 20, Enforced: true, Local: 1000, Cluster: 3000}},
		Logged:       []api.ClusterLogged{{Level: "class", Name: "gold", Local: 2, Cluster: 7}},
		SampleRounds: 5, SampleMembers: 2, SampleFallbacks: 1,
	}}
	var b bytes.Buffer
	if err := WriteTable(&b, st); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"Cluster lab: instance a, Redis 127.0.0.1:6379 UNREACHABLE, mode localShare (42 renewals, 1 outages)",
		"last error: dial tcp: connection refused",
		"a (this)", "250ms ago", "1.5s ago",
		"virtual server  web       10   -", // held unknown while Redis is unreachable
		"target          web/app1  4",
		"SHARED BANDWIDTH", "2.9 KiB/s  1000 B/s",
		"LOGGED LIMIT", "class         gold  7               2",
		"target samples: 2 members summed, 5 exchanges, 1 fallbacks",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in:\n%s", want, out)
		}
	}
	b.Reset()
	st.Cluster = nil
	WriteTable(&b, st)
	if strings.Contains(b.String(), "Cluster") {
		t.Errorf("a cluster section without a cluster:\n%s", b.String())
	}
}
