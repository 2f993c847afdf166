package appliance

import (
	"reflect"
	"testing"

	"weir/cmd/weir/api"
)

// TestRefusalsSorted: /status lists refusals by level then limit whatever
// the order they happened in (the map they are counted in has none), with
// draining refusals as instance/draining.
func TestRefusalsSorted(t *testing.T) {
	var c counters
	for _, k := range [][2]string{
		{"virtual server", "maxConnections"}, {"balancer", "targets"}, {"class", "maxBandwidth"},
		{"virtual server", "burst"}, {"instance", "maxConnections"}, {"class", "maxBandwidth"}, {"balancer", "targets"},
	} {
		c.refusal(k[0], k[1])
	}
	c.refusedDraining.Add(4)
	want := []api.Refusal{
		{Level: "balancer", Limit: "targets", Count: 2},
		{Level: "class", Limit: "maxBandwidth", Count: 2},
		{Level: "instance", Limit: "draining", Count: 4},
		{Level: "instance", Limit: "maxConnections", Count: 1},
		{Level: "virtual server", Limit: "burst", Count: 1},
		{Level: "virtual server", Limit: "maxConnections", Count: 1},
	}
	for i := 0; i < 20; i++ { // map order varies from call to call
		if got := c.refusalList(); !reflect.DeepEqual(got, want) {
			t.Fatalf("refusals\n got %v\nwant %v", got, want)
		}
	}
}

// TestStatusHasEveryNIC: the front NIC and each back arm appear in /status
// with their transport's counters when it keeps any.
func TestStatusHasEveryNIC(t *testing.T) {
	l := newLab(t, labConfig([]int{1, 1}, nil), LabOptions{})
	st := l.App.Status()
	var names []string
	for _, n := range st.NICs {
		names = append(names, n.Name)
		if len(n.Dropped) != 5 || len(n.Errors) != 3 {
			t.Errorf("nic %s: %d drop and %d error counters, want 5 and 3", n.Name, len(n.Dropped), len(n.Errors))
		}
	}
	if len(names) != 3 || names[0] != "front" {
		t.Errorf("nics %v, want front and the two back arms", names)
	}
	if st.NICs[0].Device == nil {
		t.Error("front NIC over a memory pair has no transport counters")
	}
	if len(st.Datapath.Dropped) == 0 || st.Datapath.Dropped[0].Reason != "truncated" {
		t.Errorf("datapath drops %v, want one entry per reason from truncated", st.Datapath.Dropped)
	}
}
