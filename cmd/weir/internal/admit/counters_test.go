package admit

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
