//go:build linux

package main

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"weir/bench"
	"weir/cmd/weir/api"
	"weir/internal/testutil"
)

// TestE2EMinRateTBF: a TBF rate cap (300 Kbit/s) on one target's egress,
// downloads of 256 KiB under an action with MinRate 500 and no MeanRate:
// the capped target's level of that action reads the MinRate verdict 100
// (its connections had data waiting and still moved less than MinRate),
// the uncapped target's does not, and the capped target's default level
// is not cut (the verdict is that service level's only).
func TestE2EMinRateTBF(t *testing.T) {
	w := startWeir(t, "minrate.yaml")
	// slow answers from a namespace of its own behind a veth (weir's leg
	// to it is a host socket), whose egress toward weir TBF caps; fast on
	// weir's namespace's loopback.
	back := testutil.NetNS(t)
	if err := w.ns.Do(func() error {
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "vq0"}, PeerName: "vq1"}); err != nil {
			return err
		}
		l0, err := netlink.LinkByName("vq0")
		if err != nil {
			return err
		}
		l1, err := netlink.LinkByName("vq1")
		if err != nil {
			return err
		}
		if err := netlink.LinkSetNsFd(l1, back.FD()); err != nil {
			return err
		}
		if err := netlink.AddrAdd(l0, &netlink.Addr{IPNet: mustCIDR(t, "198.18.3.1/24")}); err != nil {
			return err
		}
		return netlink.LinkSetUp(l0)
	}); err != nil {
		t.Fatal(err)
	}
	if err := back.Do(func() error {
		l1, err := netlink.LinkByName("vq1")
		if err != nil {
			return err
		}
		if err := netlink.AddrAdd(l1, &netlink.Addr{IPNet: mustCIDR(t, "198.18.3.2/24")}); err != nil {
			return err
		}
		return netlink.LinkSetUp(l1)
	}); err != nil {
		t.Fatal(err)
	}
	if err := back.Do(func() error {
		c := []string{"tc", "qdisc", "add", "dev", "vq1", "root", "tbf", "rate", "300kbit", "burst", "4kb", "latency", "2s"}
		if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
			return fmt.Errorf("%v: %v: %s", c, err, out)
		}
		return nil
	}); err != nil {
		t.Skipf("skipping: tc tbf needed: %v", err)
	}
	serve := func(name string, ln net.Listener) {
		be := &bench.Backend{Name: name, Body: 256 << 10}
		go be.Serve(ln)
		t.Cleanup(func() { be.Close() })
	}
	serve("fast", w.listen("198.18.1.1:8091"))
	ln, err := back.Listen("tcp", "198.18.3.2:8092")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	serve("slow", ln)

	done := make(chan bench.Result, 1)
	go func() {
		done <- bench.Load{Dial: w.ns.Dial, Addr: "198.18.0.30:80", Clients: 4, Duration: 12 * time.Second, Timeout: 15 * time.Second}.Run(context.Background())
	}()
	level := func(e *api.Explanation, action string) (api.ExplanationLevel, bool) {
		if e == nil {
			return api.ExplanationLevel{}, false
		}
		for _, l := range e.Levels {
			if l.Action == action {
				return l, true
			}
		}
		return api.ExplanationLevel{}, false
	}
	var slow, fast *api.Explanation
	fastTripped := ""
	w.waitStatus(30*time.Second, "slow's gold level at MinRate 100", func(st api.Status) bool {
		for _, tg := range statusService(st, "dl").Targets {
			switch tg.Name {
			case "slow":
				slow = tg.Explanation
			case "fast":
				fast = tg.Explanation
			}
		}
		if l, ok := level(fast, "gold"); ok && l.MinRateFraction != 0 && fastTripped == "" {
			fastTripped = fmt.Sprintf("%+v", *fast)
		}
		l, ok := level(slow, "gold")
		return ok && l.MinRateFraction == 100
	})
	res := <-done
	t.Logf("load: %d OK, %d bytes, per target %v", res.OK, res.Bytes, res.PerTarget)
	t.Logf("slow: %+v", *slow)
	if fast != nil {
		t.Logf("fast: %+v", *fast)
	}
	if fastTripped != "" {
		t.Errorf("uncapped fast got a MinRate verdict: %s", fastTripped)
	}
	if res.PerTarget["fast"] == 0 {
		t.Errorf("no download served by fast: %+v", res)
	}
	if slow.DefaultFraction == 100 || slow.DefaultWeight != slow.BaseWeight {
		t.Errorf("slow's default level cut too: %+v", *slow)
	}
}

func mustCIDR(t *testing.T, s string) *net.IPNet {
	t.Helper()
	ip, n, err := net.ParseCIDR(s)
	if err != nil {
		t.Fatal(err)
	}
	n.IP = ip
	return n
}
