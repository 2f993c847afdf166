//go:build linux

package e2e

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"weir/cmd/weir/api"
)

// ipVersion is one address family the end-to-end tests run over, as
// Envoy's getIpVersionsForTest: the client's VIP is 198.18.0.N or fd00::N
// (the same digits: the configs write both).
type ipVersion struct {
	name string
	v6   bool
}

func ipVersions() []ipVersion { return []ipVersion{{"ipv4", false}, {"ipv6", true}} }

// vip is VIP N's address and port in this family.
func (v ipVersion) vip(n, port int) string {
	if v.v6 {
		return net.JoinHostPort("fd00::"+strconv.Itoa(n), strconv.Itoa(port))
	}
	return net.JoinHostPort("198.18.0."+strconv.Itoa(n), strconv.Itoa(port))
}

// target is target address N's address and port in this family:
// 198.18.1.N or fd00:1::N (addIPv6Targets puts those on the loopback).
func (v ipVersion) target(n, port int) string {
	if v.v6 {
		return net.JoinHostPort("fd00:1::"+strconv.Itoa(n), strconv.Itoa(port))
	}
	return net.JoinHostPort("198.18.1."+strconv.Itoa(n), strconv.Itoa(port))
}

// addIPv6Targets puts fd00:1::1-3 on the namespace's loopback, for IPv6
// targets (newNetNS puts the IPv4 ones there).
func (w *weirProc) addIPv6Targets() {
	w.t.Helper()
	if err := w.ns.Do(func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		for i := 1; i <= 3; i++ {
			a := &netlink.Addr{IPNet: netlink.NewIPNet(net.ParseIP("fd00:1::" + strconv.Itoa(i))), Flags: unix.IFA_F_NODAD}
			if err := netlink.AddrAdd(lo, a); err != nil {
				return fmt.Errorf("address %v on lo: %w", a, err)
			}
		}
		return nil
	}); err != nil {
		w.t.Fatal(err)
	}
}

// TestE2ECoreIPVersions runs the core checks once per address family
// (client, VIP and targets all IPv4, then all IPv6), as Envoy's
// getIpVersionsForTest does: weighted round robin over keep-alive and
// new connections, per-target counts in /status; an enforced
// maxConnections that serves 2 of 6 concurrent clients and gives the rest
// the 503 page naming it, counted; a tcp target at its maxConnections that
// refuses the next client with a RST and takes it once the slot is free.
func TestE2ECoreIPVersions(t *testing.T) {
	w := startWeir(t, "core.yaml")
	w.addIPv6Targets()
	for _, ipv := range ipVersions() {
		t.Run(ipv.name, func(t *testing.T) {
			f := ipv.name
			for i, name := range []string{"a", "b", "c"} {
				w.backend(name+"-"+f, ipv.target(i+1, 8091+i), 0)
			}
			hold := make(chan struct{})
			held := w.heldBackend("held-"+f, ipv.target(1, 8094), 0, hold)
			w.echo(ipv.target(3, 2324))

			// Requests: one client, a connection each, then keep-alive.
			vip := ipv.vip(50, 80)
			res := w.load(vip, 1, 60)
			if res.OK != 60 || res.PerTarget["a-"+f] != 30 || res.PerTarget["b-"+f] != 20 || res.PerTarget["c-"+f] != 10 {
				t.Errorf("60 requests: %+v, want 30/20/10", res)
			}
			if r := w.ab("-k", "-c", "2", "-n", "120", "http://"+vip+"/"); r.complete != 120 || r.failed != 0 || r.non2xx != 0 {
				t.Errorf("ab -k: complete %d failed %d non-2xx %d\n%s", r.complete, r.failed, r.non2xx, r.out)
			}
			sum, by := pickedSum(w.status(), "web-"+f)
			t.Logf("%s: per target %v, /status picked %v (sum %d)", f, res.PerTarget, by, sum)
			if by["a-"+f] < 30 || by["b-"+f] < 20 || by["c-"+f] < 10 {
				t.Errorf("/status picked %v, want at least 30/20/10", by)
			}

			// The limit: 2 of 6 concurrent clients held at the target,
			// 4 refused with the page naming it.
			before := refusalCount(w.status(), "virtual server", "maxConnections")
			res = w.heldLoad(hold, ipv.vip(51, 80), 6, 6, func() bool {
				return refusalCount(w.status(), "virtual server", "maxConnections")-before >= 4 && held.Active() == 2
			})
			if res.OK != 2 || res.Refused503 != 4 || held.MaxActive() > 2 {
				t.Errorf("capped: ok=%d 503=%d (max at the target %d), want 2 and 4: %+v", res.OK, res.Refused503, held.MaxActive(), res)
			}
			for r := range res.Reasons {
				if !strings.Contains(r, "maxConnections 2") {
					t.Errorf("capped: 503 reason %q does not name the limit", r)
				}
			}
			if n := refusalCount(w.status(), "virtual server", "maxConnections") - before; n != 4 {
				t.Errorf("capped: weir counted %d refusals, want 4", n)
			}

			// The refusal of a tcp service: RST while the one slot is
			// taken, served once it is free.
			raw := ipv.vip(52, 23)
			c1, err := w.echoOnce(raw)
			if err != nil {
				t.Fatalf("raw: first connection: %v", err)
			}
			if c2, err := w.echoOnce(raw); err == nil {
				c2.Close()
				t.Errorf("raw: a second connection served past maxConnections 1")
			} else if !strings.Contains(err.Error(), "connection refused") && !strings.Contains(err.Error(), "connection reset") {
				t.Errorf("raw: second connection: %v, want refused or reset", err)
			}
			c1.Close()
			w.waitStatus(10*time.Second, "the raw target's slot free", func(st api.Status) bool {
				s := statusService(st, "raw-"+f)
				return s != nil && len(s.Targets) == 1 && s.Targets[0].Open == 0
			})
			c3, err := w.echoOnce(raw)
			if err != nil {
				t.Fatalf("raw: once the slot is free: %v", err)
			}
			c3.Close()
		})
	}
}
