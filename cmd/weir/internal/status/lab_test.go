package status_test

import (
	"context"
	"io"
	"testing"
	"time"

	"weir/bench"
	"weir/cmd/weir/api"
	"weir/cmd/weir/internal/appliance"
	"weir/cmd/weir/internal/lab"
	"weir/internal/testutil"
)

// TestMain fails the package if any test leaves a goroutine running.
func TestMain(m *testing.M) { testutil.VerifyNoLeaks(m) }

// waitClosed waits until every admitted connection has been reported closed:
// a client has its answer a moment before weir sees both legs end.
func waitClosed(t *testing.T, a *appliance.Appliance) {
	t.Helper()
	testutil.Eventually(t, 5*time.Second, func() bool { return a.OpenConnections() == 0 }, "every connection reported closed")
}

// TestStatusHasEveryNIC: the front NIC and each back arm appear in /status
// with their transport's counters when it keeps any.
func TestStatusHasEveryNIC(t *testing.T) {
	l := lab.Must(t, lab.WebConfig([]int{1, 1}, nil), lab.Options{})
	st := l.App.Status()
	var names []string
	for _, n := range st.NICs {
		names = append(names, n.Name)
		if len(n.Dropped) != 6 || len(n.Errors) != 3 {
			t.Errorf("nic %s: %d drop and %d error counters, want 6 and 3", n.Name, len(n.Dropped), len(n.Errors))
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

// TestConnectionsListsOpenConnection: /connections shows an open connection
// with its addresses, service, target and both legs' bytes.
func TestConnectionsListsOpenConnection(t *testing.T) {
	l := lab.Must(t, lab.WebConfig([]int{1}, nil), lab.Options{})
	c, err := l.Dial(context.Background(), "tcp", "198.19.0.80:80")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	req := "GET / HTTP/1.1\r\nHost: web\r\n\r\n"
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	var got []api.Connection
	testutil.Eventually(t, 5*time.Second, func() bool {
		got = l.App.Connections()
		return len(got) == 1 && got[0].ClientLeg.BytesReceived >= uint64(len(req)) && got[0].TargetLeg.BytesSent >= uint64(len(req))
	}, "one connection with the request counted on both legs")
	cn := got[0]
	if cn.Service != "web" || cn.Target != "t1" || cn.VIP != "198.19.0.80:80" || cn.Client == "" || cn.Start.IsZero() {
		t.Errorf("connection %+v", cn)
	}
}

// TestRawStats: the raw counters of every part reach the control plane
// through one call, NIC by NIC, for the metrics table to export.
func TestRawStats(t *testing.T) {
	l := lab.Must(t, lab.WebConfig([]int{1, 1}, nil), lab.Options{})
	res := bench.Load{Dial: l.Dial, Addr: "198.19.0.80:80", Clients: 2, Requests: 10, Duration: 30 * time.Second}.Run(context.Background())
	if res.OK != 10 {
		t.Fatalf("load: %+v", res)
	}
	waitClosed(t, l.App)
	st := l.App.RawStats()
	if st.Proxy.Accepted != 10 || st.Flows.Inserted == 0 || st.Datapath.Marked == 0 {
		t.Errorf("proxy %+v, flows %+v, datapath %+v", st.Proxy, st.Flows, st.Datapath)
	}
	var names []string
	for _, n := range st.NICs {
		names = append(names, n.Name)
		if n.Link.RxPackets == 0 || n.Link.TxPackets == 0 {
			t.Errorf("NIC %s moved nothing: %+v", n.Name, n.Link)
		}
	}
	if len(names) != 3 || names[0] != "front" || st.NICs[0].Back || !st.NICs[1].Back {
		t.Errorf("NICs %v, want the front, then the two back arms", names)
	}
	if !st.NICs[0].HasDevice || st.NICs[0].Device.RxPackets == 0 {
		t.Errorf("front device counters %+v (has %v)", st.NICs[0].Device, st.NICs[0].HasDevice)
	}
}
