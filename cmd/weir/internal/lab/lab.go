// Package lab is a whole weir deployment in one process, with no root: the
// rig the demo and the appliance's scenario tests run in. It is one of the
// two places (with the demo) that may import bench and datapath/fault; the
// product never links it.
package lab

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	"weir/bench"
	"weir/cmd/weir/internal/appliance"
	"weir/datapath"
	"weir/datapath/fault"
	"weir/netstack"
	"weir/policy"
)

// Lab is a whole weir deployment in one process, with no root: clients on
// their own gVisor stack joined to weir's front NIC by an in-memory pair, and
// every target a real HTTP server (bench.Backend) on its own gVisor stack,
// joined to its own back arm by another pair that a fault injector wraps. The
// demo runs in a Lab, and so do the appliance's tests.
//
//	clients (gVisor) ═pipe═ Engine ─ weir stack ─ arm t1 ═fault═pipe═ backend t1 (gVisor)
//	                                             └ arm t2 ═fault═pipe═ backend t2 (gVisor)
type Lab struct {
	App      *appliance.Appliance
	Client   *netstack.Stack
	Backends map[policy.TargetKey]*bench.Backend
	// Faults wraps each target's arm, toward the target; set its rates to
	// inject loss on that target's leg only.
	Faults map[policy.TargetKey]*fault.Device

	stacks []*netstack.Stack
	dial   bench.DialFunc // set when the clients are not the lab's own stack
	wg     sync.WaitGroup
}

// Options tune a Lab; the zero value works.
type Options struct {
	// ClientAddr is the clients' address; zero means 198.18.0.2 (and
	// fd00::2 for IPv6 VIPs).
	ClientAddr netip.Addr
	// Backend configures each target's server before it starts (its Name
	// is set to the target's name); nil leaves the defaults.
	Backend func(k policy.TargetKey, b *bench.Backend)
	// Appliance is passed to appliance.New with Config, Front and Backs
	// filled in.
	Appliance appliance.Options
	// Seed seeds the fault injectors; zero means 1.
	Seed uint64
	// Front, when set, replaces the in-memory pair and client stack toward
	// the clients (weir demo --tun passes a TUN in a network namespace);
	// Dial must then reach the VIPs through it.
	Front datapath.Device
	Dial  bench.DialFunc
}

// New builds the deployment for cfg: every target of every service gets
// a backend listening on its address. Targets must be `via: netstack` and
// their addresses unique. The appliance is built but not started: call
// l.App.Start to run its control loops.
func New(cfg *policy.Config, o Options) (*Lab, error) {
	cfg, err := policy.Compile(cfg)
	if err != nil {
		return nil, err
	}
	l := &Lab{Backends: map[policy.TargetKey]*bench.Backend{}, Faults: map[policy.TargetKey]*fault.Device{}}
	ok := false
	defer func() {
		if !ok {
			l.Close()
		}
	}()
	seed := o.Seed
	if seed == 0 {
		seed = 1
	}

	var arms []appliance.BackArm
	n := 0
	for _, vs := range cfg.Services {
		for _, t := range vs.Targets {
			if t.Via != policy.DialNetstack {
				return nil, fmt.Errorf("lab: target %s of %s must be via netstack", t.Name, vs.Name)
			}
			k := policy.TargetKey{Service: vs.Name, Target: t.Name}
			n++
			armAddr := armAddress(t.Addr.Addr(), n)
			weirEnd, backendEnd := datapath.NewPipe(datapath.PipeOptions{})
			f := fault.New(weirEnd, fault.Options{Seed: seed + uint64(n)})
			l.Faults[k] = f
			bits := t.Addr.Addr().BitLen()
			arms = append(arms, appliance.BackArm{
				Name:   "arm-" + vs.Name + "-" + t.Name,
				Device: f,
				Addrs:  []netip.Prefix{netip.PrefixFrom(armAddr, bits)},
				Routes: []netip.Prefix{netip.PrefixFrom(t.Addr.Addr(), bits)},
			})
			bs, err := netstack.New(netstack.Options{})
			if err != nil {
				return nil, err
			}
			l.stacks = append(l.stacks, bs)
			if _, err := bs.AddNIC(backendEnd, netstack.NICOptions{Name: "backend", Addrs: []netip.Prefix{netip.PrefixFrom(t.Addr.Addr(), bits)}}); err != nil {
				return nil, err
			}
			// A target that keeps the client's port listens on every
			// port of its service.
			ports := []uint16{t.Addr.Port()}
			if t.KeepsPort() {
				ports = ports[:0]
				for p := int(vs.Ports.Lo); p <= int(vs.Ports.Hi); p++ {
					ports = append(ports, uint16(p))
				}
			}
			b := &bench.Backend{Name: t.Name}
			if o.Backend != nil {
				o.Backend(k, b)
				b.Name = t.Name
			}
			l.Backends[k] = b
			for _, p := range ports {
				ln, err := bs.ListenTCP(t.DialAddr(p))
				if err != nil {
					return nil, fmt.Errorf("lab: backend %s: %w", t.DialAddr(p), err)
				}
				l.wg.Go(func() { b.Serve(ln) })
			}
		}
	}

	ao := o.Appliance
	ao.Config, ao.Backs = cfg, arms
	if o.Front != nil {
		if o.Dial == nil {
			return nil, errors.New("lab: a Front needs a Dial")
		}
		ao.Front, l.dial = o.Front, o.Dial
		if l.App, err = appliance.New(ao); err != nil {
			return nil, err
		}
		ok = true
		return l, nil
	}
	front, clientEnd := datapath.NewPipe(datapath.PipeOptions{QueueLen: 4096})
	ao.Front = front
	l.App, err = appliance.New(ao)
	if err != nil {
		return nil, err
	}
	l.Client, err = netstack.New(netstack.Options{})
	if err != nil {
		return nil, err
	}
	l.stacks = append(l.stacks, l.Client)
	v4, v6 := o.ClientAddr, netip.MustParseAddr("fd00::2")
	if !v4.IsValid() {
		v4 = netip.MustParseAddr("198.18.0.2")
	}
	addrs := []netip.Prefix{netip.PrefixFrom(v4, v4.BitLen()), netip.PrefixFrom(v6, 128)}
	if _, err := l.Client.AddNIC(clientEnd, netstack.NICOptions{Name: "clients", Addrs: addrs}); err != nil {
		return nil, err
	}
	ok = true
	return l, nil
}

// armAddress picks weir's own address on the arm toward target number n:
// 198.18.255.n for IPv4 targets, fd00:ffff::n for IPv6 ones.
func armAddress(target netip.Addr, n int) netip.Addr {
	if target.Is4() {
		return netip.AddrFrom4([4]byte{198, 18, 255, byte(n)})
	}
	b := netip.MustParseAddr("fd00:ffff::").As16()
	b[14], b[15] = byte(n>>8), byte(n)
	return netip.AddrFrom16(b)
}

// Dial opens a client connection to addr (a VIP:port) through weir.
func (l *Lab) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	if l.dial != nil {
		return l.dial(ctx, network, addr)
	}
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return nil, err
	}
	c, err := l.Client.DialTCP(ctx, netip.AddrPort{}, ap)
	if err != nil {
		return nil, err
	}
	return c, nil
}

// Close stops everything the lab started.
func (l *Lab) Close() error {
	var errs []error
	if l.App != nil {
		errs = append(errs, l.App.Close())
	}
	for _, b := range l.Backends {
		b.Close()
	}
	for _, s := range l.stacks {
		errs = append(errs, s.Close())
	}
	l.wg.Wait()
	return errors.Join(errs...)
}

// WebConfig is a config with one http service "web" on 198.19.0.80:80 whose
// targets are named t1.. with the given weights and maxConnections (nil:
// none), a rule putting its replies under action gold, and the monitor on
// with an hour's sampling interval (tests sample with SampleNow).
func WebConfig(weights []int, maxConns []int64) *policy.Config {
	vs := &policy.VirtualServer{
		Name:  "web",
		VIPs:  []netip.Addr{netip.MustParseAddr("198.19.0.80"), netip.MustParseAddr("fd00::80")},
		Ports: policy.PortRange{Lo: 80, Hi: 80},
		Proto: policy.ProtoHTTP,
	}
	for i, w := range weights {
		t := &policy.Target{
			Name:   "t" + string(rune('1'+i)),
			Addr:   netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 19, 1, byte(10 + i)}), 8080),
			Weight: w,
			Via:    policy.DialNetstack,
		}
		if maxConns != nil {
			t.MaxConnections = maxConns[i]
		}
		vs.Targets = append(vs.Targets, t)
	}
	act := &policy.Action{Name: "gold", OutgoingTOS: 0xA0, SetTOS: true}
	return &policy.Config{
		Services: []*policy.VirtualServer{vs},
		Actions:  []*policy.Action{act},
		Rules:    []*policy.Rule{{Name: "web", ProtoLo: 6, ProtoHi: 6, SrcPort: policy.PortRange{Lo: 80, Hi: 80}, Action: act}},
		Monitor:  policy.Monitor{Enabled: true, SamplingInterval: time.Hour},
	}
}

// TB is what Must needs of a *testing.T (the lab does not import testing:
// weir demo links it).
type TB interface {
	Helper()
	Fatal(args ...any)
	Cleanup(func())
}

// Must is New for a test: it fails t when the lab cannot start and closes
// the lab when the test ends.
func Must(t TB, cfg *policy.Config, o Options) *Lab {
	t.Helper()
	l, err := New(cfg, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}
