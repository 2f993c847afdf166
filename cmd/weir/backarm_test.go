package main

import (
	"net/netip"
	"slices"
	"testing"

	"weir/policy"
)

// TestBackArmRoutes: the back arm is there whatever the config (a reload
// may add the first netstack target), its default addresses are routed
// into the TUN only for the families the config's netstack targets use,
// addresses given with --back-addr always, and --back-addr none has none.
func TestBackArmRoutes(t *testing.T) {
	cfg := func(targets ...*policy.Target) *policy.Config {
		return &policy.Config{Services: []*policy.VirtualServer{{Name: "web", Targets: targets}}}
	}
	host4 := &policy.Target{Addr: netip.MustParseAddrPort("198.18.3.1:80"), Via: policy.DialHost}
	ns4 := &policy.Target{Addr: netip.MustParseAddrPort("198.18.3.2:80"), Via: policy.DialNetstack}
	ns6 := &policy.Target{Addr: netip.MustParseAddrPort("[fd00::2]:80"), Via: policy.DialNetstack}
	r4, r6 := netip.MustParsePrefix("198.19.254.1/32"), netip.MustParsePrefix("fd57:6569:72ff::1/128")
	for _, tc := range []struct {
		name   string
		cfg    *policy.Config
		flags  []string
		arms   int
		routes []netip.Prefix
	}{
		{"no netstack target", cfg(host4), nil, 1, nil},
		{"an IPv4 netstack target", cfg(host4, ns4), nil, 1, []netip.Prefix{r4}},
		{"both families", cfg(ns4, ns6), nil, 1, []netip.Prefix{r4, r6}},
		{"--back-addr", cfg(host4), []string{"198.19.9.1"}, 1, []netip.Prefix{netip.MustParsePrefix("198.19.9.1/32")}},
		{"--back-addr none", cfg(ns4), []string{"none"}, 0, nil},
	} {
		arms, routes, err := backArm(tc.cfg, tc.flags)
		if err != nil || len(arms) != tc.arms || !slices.Equal(routes, tc.routes) {
			t.Errorf("%s: %d arms, routes %v, %v; want %d, %v", tc.name, len(arms), routes, err, tc.arms, tc.routes)
		}
		// A reload to a config with an IPv4 netstack target routes its
		// family (explicit addresses: all of them).
		if len(arms) > 0 {
			got := backRoutesFor(cfg(ns4), arms, len(tc.flags) > 0)
			if len(got) == 0 || !got[0].Addr().Is4() {
				t.Errorf("%s: after a reload adding an IPv4 netstack target, routes %v", tc.name, got)
			}
		}
	}
}
