package view

import (
	"errors"
	"strings"
	"testing"
	"time"

	"weir/cmd/weir/api"
)

func sample() api.Status {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	return api.Status{
		Instance: "edge1", Source: "weir.yaml", Generation: 3, LoadedAt: at, Open: 7,
		ReloadError: &api.ReloadError{At: at, Err: "line 4: unknown key"},
		Levels: []api.Level{
			{Level: "instance", Name: "edge1", Connections: 7, MaxConnections: 100, EnforceConnections: true, Bandwidth: 3 << 20},
			{Level: "virtual server", Name: "web", Connections: 7, MaxBandwidth: 1000, Bandwidth: 1200, Over: true},
		},
		Services: []api.Service{{
			Name: "web", Proto: "http", VIPs: []string{"198.18.0.80"}, Ports: "80", Balancer: "wrr", Refused: 2,
			Targets: []api.Target{
				{Name: "t1", Role: "primary", Weight: 40, Effective: 20, Open: 3, Max: 10, HealthUp: true, Picked: 11,
					Explanation: &api.Explanation{LossRatio: 25, LossFraction: 50, Fraction: 100, Winner: "minrate", DefaultFraction: 50},
					Exact:       20,
					Actions:     []api.ActionLevel{{Action: "gold", Fraction: 100, Exact: 0, Effective: 0}, {Action: "bronze", Fraction: 62, Exact: 15.2, Effective: 15}},
					Segments: &api.Segments{Direction: "from_target",
						FromTarget: api.DirTotals{DataSegments: 2000, Retransmitted: 100, Timeouts: 2, OutOfOrder: 40, Source: "measured"},
						ToTarget:   api.DirTotals{DataSegments: 50, Source: "measured"}}},
				{Name: "t2", Role: "backup", Weight: 1, Effective: 1, Exact: 0.75, Down: true, DownUntil: at.Add(time.Minute), HealthUp: true},
			},
		}},
		Refusals: []api.Refusal{{Level: "balancer", Limit: "targets", Count: 2}, {Level: "virtual server", Limit: "maxBandwidth", Count: 5}},
		Datapath: api.Datapath{Dropped: []api.Drop{{Reason: "truncated", Count: 0}, {Reason: "bad_ihl", Count: 4}}, Flows: api.FlowTable{Refused: 9}},
		NICs:     []api.NIC{{Name: "front", Dropped: []api.Drop{{Reason: "queue_full", Count: 6}}, Device: &api.Device{DroppedTooBig: 1}}},
		Control:  api.Control{DroppedLogLines: 8},
	}
}

func TestWriteTable(t *testing.T) {
	var b strings.Builder
	if err := WriteTable(&b, sample()); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"weir edge1 — config generation 3 from weir.yaml, loaded 2026-01-02 03:04:05",
		"7 open connections",
		"last reload FAILED at 2026-01-02 03:04:05: line 4: unknown key",
		"virtual server  web    7      -    1.2 KiB/s",
		"1000 (log)",
		"OVER",
		"3.0 MiB/s",
		"web (http 198.18.0.80 port 80, wrr), 2 refused: no target",
		"50% (2.5%)",
		"100% minrate",
		"SERVICE LEVEL  TARGET  FRACTION  EFFECTIVE  EXACT\n" +
			"  (no action)    t1      50%       20         20\n" +
			"  (no action)    t2      -         1          0.75\n" +
			"  bronze         t1      62%       15         15.2\n" +
			"  gold           t1      100%      0          0\n",
		"down until 03:05:05",
		"3/10",
		"from_target ←  2000  100 (5.0%)",
		"to_target      50    0 (0.0%)",
		"0/∞",
		"  balancer targets: 2\n  virtual server maxBandwidth: 5\n",
		"Counted drops\n  datapath bad_ihl: 4\n  flow table full (flows): 9\n  nic front queue_full: 6\n  transport front too_big: 1\n  log lines: 8\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "truncated") {
		t.Errorf("a zero drop counter is listed:\n%s", out)
	}
}

func TestWriteTableQuietWhenNothingDropped(t *testing.T) {
	var b strings.Builder
	WriteTable(&b, api.Status{Instance: "x"})
	if s := b.String(); strings.Contains(s, "Counted drops") || strings.Contains(s, "Refusals") || strings.Contains(s, "SERVICE LEVEL") {
		t.Errorf("empty status prints drops or refusals:\n%s", s)
	}
}

type failWriter struct{ n int }

func (f *failWriter) Write(p []byte) (int, error) {
	if f.n--; f.n < 0 {
		return 0, errors.New("broken pipe")
	}
	return len(p), nil
}

func TestWriteTableReportsWriteError(t *testing.T) {
	if err := WriteTable(&failWriter{n: 3}, sample()); err == nil || err.Error() != "broken pipe" {
		t.Fatalf("WriteTable to a failing writer: %v, want broken pipe", err)
	}
}

func TestHuman(t *testing.T) {
	for _, tc := range []struct {
		n    int64
		want string
	}{{0, "0 B"}, {1023, "1023 B"}, {1024, "1.0 KiB"}, {1536, "1.5 KiB"}, {5 << 30, "5.0 GiB"}} {
		if got := human(tc.n); got != tc.want {
			t.Errorf("human(%d) = %q, want %q", tc.n, got, tc.want)
		}
	}
}

// TestWriteTableHostCapture: weir status says how the via: host legs are
// measured: the capture's state, why it is off, and its losses.
func TestWriteTableHostCapture(t *testing.T) {
	var b strings.Builder
	WriteTable(&b, api.Status{Instance: "x", HostCapture: &api.HostCapture{State: "off", Reason: "cannot be opened: operation not permitted", Targets: 2}})
	if s := b.String(); !strings.Contains(s, "host capture off (cannot be opened: operation not permitted): 2 via: host targets") {
		t.Errorf("no host capture line:\n%s", s)
	}
	b.Reset()
	WriteTable(&b, api.Status{Instance: "x", HostCapture: &api.HostCapture{State: "on", Targets: 1, Dropped: 7, DroppedLastInterval: 3}})
	if s := b.String(); !strings.Contains(s, "7 lost (3 in the last interval)") {
		t.Errorf("no capture loss:\n%s", s)
	}
}

// TestWriteTableQueuesAndClients: weir status lists the queues at the
// connection limits (length, waits, timeouts, mean wait) and the
// per-client tables.
func TestWriteTableQueuesAndClients(t *testing.T) {
	st := api.Status{
		Levels: []api.Level{
			{Level: "virtual server", Name: "web", Connections: 2, MaxConnections: 2, EnforceConnections: true,
				Queue: &api.Queue{Limit: 8, TimeoutMs: 2000, Waiting: 3, Waits: 10, Served: 6, TimedOut: 1, Full: 2, WaitedSec: 3.5}},
			{Level: "instance", Name: "weir"},
		},
		Clients: []api.ClientTable{{Scope: "web", MaxConnections: 2, EnforceConnections: true, PrefixV4: 24, PrefixV6: 128,
			Clients: 40, Active: 5, Size: 100000, Refused: 7, Evicted: 1, Overflow: 0,
			Queue: &api.Queue{Limit: 1, TimeoutMs: 1000, Waits: 2, Served: 2, WaitedSec: 0.2}}},
	}
	var b strings.Builder
	if err := WriteTable(&b, st); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"Queues at maxConnections",
		"virtual server  web   3        8      2s       10     6       1          2     500ms",
		"client          web   0        1      1s       2      2       0          0     100ms",
		"Per-client limits",
		"web    /24 /128",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("weir status lacks %q:\n%s", want, out)
		}
	}
}

// TestWriteTableUDP: weir status shows the udp sessions once there is a
// udp endpoint, and nothing of them before.
func TestWriteTableUDP(t *testing.T) {
	var b strings.Builder
	if err := WriteTable(&b, api.Status{}); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(b.String(), "UDP sessions") {
		t.Errorf("a weir without udp services shows a UDP table:\n%s", b.String())
	}
	b.Reset()
	st := api.Status{UDP: api.UDP{Sessions: 3, Endpoints: 2, Created: 300, Refused: 4, DroppedVIP: 1,
		DatagramsIn: 300, DatagramsOut: 297, BytesIn: 12000, BytesOut: 30 << 10, EndedResponses: 296, EndedUnanswered: 1}}
	if err := WriteTable(&b, st); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"UDP sessions",
		"OPEN  ENDPOINTS  CREATED  REFUSED  TABLE FULL  VIP FULL  DATAGRAMS IN/OUT  BYTES IN/OUT",
		"3     2          300      4        0           1         300/297",
		"ended: 0 idle, 296 after their responses, 1 unanswered, 0 target error, 0 at shutdown",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("weir status lacks %q:\n%s", want, out)
		}
	}
}

// TestWriteTableReplies: a udp target's reply latency shows under its
// service, the interval's and the total, a dash where an interval had no
// reply; a target without one shows none.
func TestWriteTableReplies(t *testing.T) {
	st := api.Status{Services: []api.Service{{Name: "dns", Proto: "udp", VIPs: []string{"198.18.0.53"}, Ports: "53", Targets: []api.Target{
		{Name: "a", Role: "primary", Weight: 2, HealthUp: true, Replies: &api.ReplyLatency{
			Interval: api.LatencySummary{Replies: 200, P50: 0.412, P99: 3.5}, Total: api.LatencySummary{Replies: 1200, P50: 0.398, P99: 12.25}}},
		{Name: "b", Role: "primary", Weight: 1, HealthUp: true, Replies: &api.ReplyLatency{Total: api.LatencySummary{Replies: 7, P50: 150, P99: 2000}}},
		{Name: "c", Role: "primary", Weight: 1, HealthUp: true},
	}}}}
	var b strings.Builder
	if err := WriteTable(&b, st); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"REPLIES  INTERVAL  P50       P99     TOTAL  P50       P99",
		"a        200       0.412 ms  3.5 ms  1200   0.398 ms  12.2 ms",
		"b        0         -         -       7      150 ms    2000 ms",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("weir status lacks %q:\n%s", want, out)
		}
	}
	if _, replies, _ := strings.Cut(out, "REPLIES"); strings.Contains(replies, "\n  c ") {
		t.Errorf("target c has no replies but shows a row:\n%s", out)
	}
}
