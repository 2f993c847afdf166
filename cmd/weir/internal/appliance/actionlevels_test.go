package appliance_test

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"weir/bench"
	"weir/cmd/weir/api"
	"weir/cmd/weir/internal/appliance"
	"weir/cmd/weir/internal/lab"
	"weir/internal/testutil"
	"weir/policy"
)

// TestActionLevelsInStatusAndStats: three connections under the action
// gold (maxConnections 2) held open, two at t1 and one at t2: t1's gold
// level is at the connection fraction 100 (80 % of 2 reached), t2's at 50.
// /status carries each target's gold level (fraction, exact and rounded
// weight, what the balancer holds) beside its uncut default level, and the
// STATS line of each target names them.
func TestActionLevelsInStatusAndStats(t *testing.T) {
	cfg := lab.WebConfig([]int{1, 1}, nil)
	cfg.Actions[0].MaxConnections = 2
	var logBuf testutil.SyncBuffer
	log := zerolog.New(&logBuf)
	hold := make(chan struct{})
	l := lab.Must(t, cfg, lab.Options{
		Backend:   func(_ policy.TargetKey, b *bench.Backend) { b.Hold = hold },
		Appliance: appliance.Options{Log: &log},
	})
	done := make(chan bench.Result, 1)
	go func() {
		done <- bench.Load{Dial: l.Dial, Addr: "198.19.0.80:80", Clients: 3, Requests: 3, Duration: 30 * time.Second}.Run(context.Background())
	}()
	open := func() (n int64) {
		for _, c := range l.App.OpenByTarget() {
			n += c
		}
		return n
	}
	// The balancer counts a connection open when it picks the target, the
	// forwarder samples it (the action level's connections) only once the
	// target leg is dialled: wait until every backend holds its request,
	// which the forwarder can pass on only after registering the flow.
	heldAtBackends := func() (n int64) {
		for _, b := range l.Backends {
			n += b.Active()
		}
		return n
	}
	held := testutil.Within(20*time.Second, func() bool { return open() == 3 && heldAtBackends() == 3 })
	if held {
		l.App.SampleNow()
	}
	st := l.App.Status()
	close(hold)
	if res := <-done; !held || res.OK != 3 {
		t.Fatalf("3 held connections: held %v, %+v", held, res)
	}

	byName := map[string]api.Target{}
	for _, tg := range st.Services[0].Targets {
		byName[tg.Name] = tg
	}
	// Smooth weighted round robin over equal weights: t1, t2, t1.
	want := map[string]api.ActionLevel{
		"t1": {Action: "gold", Fraction: 100, Exact: 0, Effective: 0},
		"t2": {Action: "gold", Fraction: 50, Exact: 0.5, Effective: 1},
	}
	for name, w := range want {
		tg := byName[name]
		if len(tg.Actions) != 1 || tg.Actions[0] != w {
			t.Errorf("%s: action levels %+v, want [%+v]", name, tg.Actions, w)
		}
		if tg.Effective != 1 || tg.Exact != 1 {
			t.Errorf("%s: default level effective %d exact %v, want uncut 1", name, tg.Effective, tg.Exact)
		}
	}

	stats := map[string]map[string]any{}
	for _, line := range strings.Split(logBuf.String(), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil && strings.HasPrefix(m["message"].(string), "STATS ") {
			stats[m["target"].(string)] = m
		}
	}
	for name, w := range want {
		m := stats[name]
		if m == nil {
			t.Errorf("no STATS line for %s:\n%s", name, logBuf.String())
			continue
		}
		gold, _ := m["actions"].(map[string]any)["gold"].(map[string]any)
		if gold["fraction"] != float64(w.Fraction) || gold["effective"] != float64(w.Effective) {
			t.Errorf("%s: STATS actions %v, want gold fraction %d effective %d", name, m["actions"], w.Fraction, w.Effective)
		}
		if msg := m["message"].(string); !strings.HasSuffix(msg, " levels=gold:"+strconv.Itoa(w.Fraction)+"%->"+strconv.Itoa(w.Effective)) {
			t.Errorf("%s: STATS message %q does not end with its gold level", name, msg)
		}
	}
}
