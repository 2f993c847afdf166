package appliance

import (
	"context"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"weir/bench"
	"weir/datapath"
	"weir/netstack"
	"weir/policy"
)

// End-to-end benchmarks: a client gVisor stack → weir (engine, stack,
// admission, balancer, splice) → a backend gVisor stack, every hop an
// in-memory pair, against a baseline measured in the same run: the same
// client talking to the same kind of backend over one pair, without weir.
// Run with `make bench-e2e`. CPU cost is reported per operation from
// getrusage, all goroutines (both stacks and weir) included.

func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// direct is the baseline: a client stack and a backend stack on one pair.
type direct struct {
	client, server *netstack.Stack
	addr           string
}

func newDirect(b *testing.B, body int) *direct {
	b.Helper()
	ce, se := datapath.NewPipe(datapath.PipeOptions{QueueLen: 4096})
	cs, err := netstack.New(netstack.Options{})
	if err != nil {
		b.Fatal(err)
	}
	ss, err := netstack.New(netstack.Options{})
	if err != nil {
		b.Fatal(err)
	}
	srv := netip.MustParseAddrPort("198.19.1.10:8080")
	if _, err := cs.AddNIC(ce, netstack.NICOptions{Addrs: []netip.Prefix{netip.MustParsePrefix("198.18.0.2/32")}}); err != nil {
		b.Fatal(err)
	}
	if _, err := ss.AddNIC(se, netstack.NICOptions{Addrs: []netip.Prefix{netip.PrefixFrom(srv.Addr(), 32)}}); err != nil {
		b.Fatal(err)
	}
	ln, err := ss.ListenTCP(srv)
	if err != nil {
		b.Fatal(err)
	}
	be := &bench.Backend{Name: "direct", Body: body}
	go be.Serve(ln)
	d := &direct{client: cs, server: ss, addr: srv.String()}
	b.Cleanup(func() { be.Close(); cs.Close(); ss.Close() })
	return d
}

func (d *direct) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	return d.client.DialTCP(ctx, netip.AddrPort{}, netip.MustParseAddrPort(addr))
}

func benchLoad(b *testing.B, dial bench.DialFunc, addr string, body, clients int) {
	b.Helper()
	b.ReportAllocs()
	cpu0 := cpuTime()
	start := time.Now()
	res := bench.Load{Dial: dial, Addr: addr, Clients: clients, Requests: b.N, Duration: 10 * time.Minute, Timeout: 30 * time.Second}.Run(context.Background())
	el := time.Since(start)
	cpu := cpuTime() - cpu0
	if res.OK != b.N {
		b.Fatalf("%d of %d requests OK: %+v", res.OK, b.N, res.Errors)
	}
	b.ReportMetric(float64(b.N)/el.Seconds(), "conns/s")
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/conn")
	if body > 1000 {
		b.ReportMetric(float64(res.Bytes)/el.Seconds()/1e6, "MB/s")
	}
}

func labFor(b *testing.B, body int) *Lab {
	b.Helper()
	cfg := &policy.Config{Services: []*policy.VirtualServer{{
		Name: "web", VIPs: []netip.Addr{netip.MustParseAddr("198.19.0.80")}, Ports: policy.PortRange{Lo: 80, Hi: 80}, Proto: policy.ProtoHTTP,
		Targets: []*policy.Target{{Name: "t1", Addr: netip.MustParseAddrPort("198.19.1.10:8080"), Weight: 1, Via: policy.DialNetstack}},
	}}}
	l, err := NewLab(cfg, LabOptions{Backend: func(_ policy.TargetKey, be *bench.Backend) { be.Body = body }})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { l.Close() })
	return l
}

// BenchmarkConnections: one short HTTP request per connection, 8 clients.
func BenchmarkConnections(b *testing.B) {
	b.Run("direct", func(b *testing.B) {
		d := newDirect(b, 0)
		benchLoad(b, d.Dial, d.addr, 0, 8)
	})
	b.Run("weir", func(b *testing.B) {
		l := labFor(b, 0)
		benchLoad(b, l.Dial, "198.19.0.80:80", 0, 8)
	})
}

// BenchmarkBulk: 1 MiB responses, 4 clients.
func BenchmarkBulk(b *testing.B) {
	const body = 1 << 20
	b.Run("direct", func(b *testing.B) {
		d := newDirect(b, body)
		benchLoad(b, d.Dial, d.addr, body, 4)
	})
	b.Run("weir", func(b *testing.B) {
		l := labFor(b, body)
		benchLoad(b, l.Dial, "198.19.0.80:80", body, 4)
	})
}
