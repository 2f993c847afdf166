//go:build linux

package e2e

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"weir/bench"
	"weir/cmd/weir/api"
)

// TestE2EPerActionBalancing is the z/OS Policy Action fraction per service
// level through the real binary ("a target's DVIPA/Port … using that
// service level"): 4 gold connections (from 198.18.1.3; the action allows
// 4 per target) held open at b put b's gold level at the connection
// fraction 100 (80 % of 4 reached: weight 0). While it holds, every new
// gold connection goes to a, and new connections under no action still
// spread over a and b, whose default level is uncut. It fails if the
// balancer picked gold connections on the default table (half of them
// would reach b) or unclassified ones on gold's (none would). The level's
// fraction, weight and STATS line are checked on the way.
//
// The cut comes from the connection fraction, not a MinRate verdict
// (TestE2EMinRateTBF): it holds steadily for as long as the test holds
// the connections, where a TBF-capped target's verdict can lapse for an
// interval when contention makes its connections' reads gappy.
func TestE2EPerActionBalancing(t *testing.T) {
	w := startWeir(t, "levels.yaml")
	hold := make(chan struct{})
	var closeHold sync.Once
	release := func() { closeHold.Do(func() { close(hold) }) }
	defer release()
	// Each target answers / at once; /hold waits for hold at b only, so
	// the gold clients pile up there.
	serve := func(name, addr string, held bool) {
		mux := http.NewServeMux()
		mux.Handle("/", &bench.Backend{Name: name})
		if held {
			mux.Handle("/hold", &bench.Backend{Name: name, Hold: hold})
		} else {
			mux.Handle("/hold", &bench.Backend{Name: name})
		}
		srv := &http.Server{Handler: mux}
		go srv.Serve(w.listen(addr))
		t.Cleanup(func() { srv.Close() })
	}
	serve("a", "198.18.1.1:8095", false)
	serve("b", "198.18.1.2:8096", true)

	const vip, goldSrc = "198.18.0.32:80", "198.18.1.3"
	dialFrom := func(ctx context.Context, src string) (net.Conn, error) {
		var c net.Conn
		err := w.ns.Do(func() (err error) {
			d := net.Dialer{Timeout: 10 * time.Second}
			if src != "" {
				d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(src)}
			}
			c, err = d.DialContext(ctx, "tcp", vip)
			return err
		})
		return c, err
	}
	loadDone := make(chan bench.Result, 1)
	go func() {
		loadDone <- bench.Load{
			Dial: func(ctx context.Context, _, _ string) (net.Conn, error) { return dialFrom(ctx, goldSrc) },
			Addr: vip, Path: "/hold", Clients: 4, Requests: 40, Duration: 60 * time.Second, Timeout: 60 * time.Second,
		}.Run(context.Background())
	}()
	defer func() { release(); <-loadDone }()

	// cut reports whether st shows b's gold level at 100 % (weight 0),
	// a's gold level and b's default level uncut.
	cut := func(st api.Status) bool {
		var aGold, bGold *api.ActionLevel
		bDefault := 0.0
		for _, tg := range statusService(st, "dl").Targets {
			for i := range tg.Actions {
				if tg.Actions[i].Action != "gold" {
					continue
				}
				switch tg.Name {
				case "a":
					aGold = &tg.Actions[i]
				case "b":
					bGold, bDefault = &tg.Actions[i], tg.Exact
				}
			}
		}
		return aGold != nil && bGold != nil && bGold.Fraction == 100 && bGold.Exact == 0 && bGold.Effective == 0 &&
			aGold.Fraction == 0 && aGold.Exact == 1 && bDefault == 1
	}
	st := w.waitStatus(30*time.Second, "b's gold level cut by its connection fraction", cut)
	t.Logf("cut: %+v", statusService(st, "dl").Targets)
	if l, ok := w.waitLog(5*time.Second, "STATS", `target="b"`, "levels=gold:100%->0"); !ok {
		t.Errorf("no STATS line with b's gold level at 100%%: %s", l.raw)
	}
	fams := w.metrics()
	for _, m := range []struct {
		name, target string
		want         float64
	}{
		{"weir_target_action_weight", "b", 0}, {"weir_target_action_fraction_percent", "b", 100},
		{"weir_target_action_weight", "a", 1}, {"weir_target_action_fraction_percent", "a", 0},
	} {
		if got := metricSum(fams, m.name, map[string]string{"service": "dl", "target": m.target, "action": "gold"}); got != m.want {
			t.Errorf("%s{target=%s,action=gold} = %v, want %v", m.name, m.target, got, m.want)
		}
	}

	// probe opens one connection (from src, or the default source), asks
	// for /, and returns the target the answer names: the balancer's pick.
	probe := func(src string) (string, error) {
		c, err := dialFrom(context.Background(), src)
		if err != nil {
			return "", err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(15 * time.Second))
		if _, err := fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: dl\r\nConnection: close\r\n\r\n"); err != nil {
			return "", err
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return "", err
		}
		resp.Body.Close()
		return resp.Header.Get("X-Weir-Target"), nil
	}
	// 40 gold and 40 unclassified probes in a shuffled order: in strict
	// alternation a round robin shared by both (a fallback to one table)
	// would hand every gold probe the same target and hide the fault.
	gold, plain := map[string]int{}, map[string]int{}
	order := make([]bool, 80) // true: gold
	for i := range 40 {
		order[i] = true
	}
	rand.New(rand.NewPCG(1, 2)).Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
	for _, isGold := range order {
		src, into := "", plain
		if isGold {
			src, into = goldSrc, gold
		}
		target, err := probe(src)
		if err != nil {
			t.Fatalf("probe from %q: %v", src, err)
		}
		into[target]++
	}
	if st := w.status(); !cut(st) {
		t.Fatalf("the cut did not hold while probing: %+v", statusService(st, "dl").Targets)
	}
	t.Logf("while b's gold level was cut: gold %v, unclassified %v", gold, plain)
	if gold["a"] != 40 {
		t.Errorf("gold connections went %v, want all 40 to a (b's gold level is cut to 0; balanced on the default table?)", gold)
	}
	if plain["a"] < 10 || plain["b"] < 10 {
		t.Errorf("unclassified connections went %v, want both a and b (b's default level is uncut; balanced on gold's table?)", plain)
	}
}
