package balancer_test

import (
	"fmt"
	"net/netip"
	"time"

	"weir/balancer"
	"weir/policy"
)

// The WebSphere plug-in scenario: two members with MaxConnections 3 and 4.
// The eighth concurrent connection is refused with the reason, and a member
// serves again as soon as one of its connections closes.
func Example() {
	vs := &policy.VirtualServer{Name: "shop", VIPs: []netip.Addr{netip.MustParseAddr("192.0.2.80")},
		Ports: policy.PortRange{Lo: 80, Hi: 80}, Targets: []*policy.Target{
			{Name: "wasmember05", Addr: netip.MustParseAddrPort("10.0.0.5:9080"), Weight: 1, MaxConnections: 3},
			{Name: "wasmember06", Addr: netip.MustParseAddrPort("10.0.0.6:9080"), Weight: 1, MaxConnections: 4},
		}}
	// Compile fills the defaults (retry interval, attempts) the balancer
	// takes as given.
	cfg, err := policy.Compile(&policy.Config{Services: []*policy.VirtualServer{vs}})
	if err != nil {
		panic(err)
	}
	b := balancer.New(cfg.Services[0], cfg.Balancer)
	now := time.Date(2005, 5, 11, 7, 26, 23, 0, time.UTC)
	var open []balancer.Lease
	for range 8 {
		l, err := b.PickAction(now, 0, nil, nil)
		if err != nil {
			fmt.Println("503:", err)
			continue
		}
		fmt.Println("to", l.Name(), l.Target().Addr)
		open = append(open, l)
	}
	open[0].Release() // a connection to wasmember05 closes
	l, _ := b.PickAction(now, 0, nil, nil)
	fmt.Println("to", l.Name())
	// Output:
	// to wasmember05 10.0.0.5:9080
	// to wasmember06 10.0.0.6:9080
	// to wasmember05 10.0.0.5:9080
	// to wasmember06 10.0.0.6:9080
	// to wasmember05 10.0.0.5:9080
	// to wasmember06 10.0.0.6:9080
	// to wasmember06 10.0.0.6:9080
	// 503: all targets unavailable: wasmember05 (at limit 3/3), wasmember06 (at limit 4/4)
	// to wasmember05
}
