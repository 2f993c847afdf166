package lab

import (
	"context"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
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
//
// Wall time alone misleads on a shared machine: the direct and weir runs
// happen one after the other, and what else the machine runs in between
// sets their MB/s (on a 2-core machine with a load average of 8, the same
// BenchmarkBulk/weir measured 25, 52 and 103 MB/s in one -count 3 run).
// Two more metrics tell waiting for a CPU from waiting inside TCP:
//
//   - runq-µs/conn: time this process's threads were runnable but waiting
//     for a CPU (schedstat, Linux only). Comparable to cpu-µs/conn means the
//     machine's other load set the wall time.
//   - retx/conn: TCP segments retransmitted by every stack in the topology.
//     The pairs never drop here, so these are spurious: a tail-loss probe
//     or timeout that fired before the ACK was processed (every one reached
//     the receiver as a duplicate). gVisor receivers send no DSACK, so each
//     probe also counts as a loss and cuts the sender's CUBIC window.

func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// runqWait returns the time this process's threads have spent runnable but
// not running, summed over its live threads, and false where the kernel
// does not say (no /proc/self/task/*/schedstat).
func runqWait() (time.Duration, bool) {
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return 0, false
	}
	var sum time.Duration
	ok := false
	for _, t := range tasks {
		b, err := os.ReadFile("/proc/self/task/" + t.Name() + "/schedstat")
		if err != nil {
			continue // the thread exited
		}
		// Fields: time on CPU, time waiting on a run queue (ns), timeslices.
		f := strings.Fields(string(b))
		if len(f) < 2 {
			continue
		}
		w, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			continue
		}
		sum += time.Duration(w)
		ok = true
	}
	return sum, ok
}

// retransmits sums the TCP retransmissions of stacks.
func retransmits(stacks ...*netstack.Stack) uint64 {
	var n uint64
	for _, s := range stacks {
		n += s.Stats().TCPRetransmits
	}
	return n
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

func (d *direct) retransmits() uint64 { return retransmits(d.client, d.server) }

func (d *direct) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	return d.client.DialTCP(ctx, netip.AddrPort{}, netip.MustParseAddrPort(addr))
}

// benchLoad runs b.N requests from clients concurrent clients; retx returns
// the topology's TCP retransmissions so far.
func benchLoad(b *testing.B, dial bench.DialFunc, addr string, body, clients int, retx func() uint64) {
	b.Helper()
	b.ReportAllocs()
	rq0, rqOK := runqWait()
	rx0 := retx()
	cpu0 := cpuTime()
	start := time.Now()
	res := bench.Load{Dial: dial, Addr: addr, Clients: clients, Requests: b.N, Duration: 10 * time.Minute, Timeout: 30 * time.Second}.Run(context.Background())
	el := time.Since(start)
	cpu := cpuTime() - cpu0
	rq1, _ := runqWait()
	rx := retx() - rx0
	if res.OK != b.N {
		b.Fatalf("%d of %d requests OK: %+v", res.OK, b.N, res.Errors)
	}
	b.ReportMetric(float64(b.N)/el.Seconds(), "conns/s")
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/conn")
	if rqOK {
		b.ReportMetric(float64(max(rq1-rq0, 0).Microseconds())/float64(b.N), "runq-µs/conn")
	}
	b.ReportMetric(float64(rx)/float64(b.N), "retx/conn")
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
	l, err := New(cfg, Options{Backend: func(_ policy.TargetKey, be *bench.Backend) { be.Body = body }})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { l.Close() })
	return l
}

// retransmits sums the TCP retransmissions of every stack in the lab:
// clients, weir and backends.
func (l *Lab) retransmits() uint64 {
	return retransmits(l.stacks...) + l.App.StackStats().TCPRetransmits
}

// BenchmarkConnections: one short HTTP request per connection, 8 clients.
func BenchmarkConnections(b *testing.B) {
	b.Run("direct", func(b *testing.B) {
		d := newDirect(b, 0)
		benchLoad(b, d.Dial, d.addr, 0, 8, d.retransmits)
	})
	b.Run("weir", func(b *testing.B) {
		l := labFor(b, 0)
		benchLoad(b, l.Dial, "198.19.0.80:80", 0, 8, l.retransmits)
	})
}

// BenchmarkBulk: 1 MiB responses, 4 clients.
func BenchmarkBulk(b *testing.B) {
	const body = 1 << 20
	b.Run("direct", func(b *testing.B) {
		d := newDirect(b, body)
		benchLoad(b, d.Dial, d.addr, body, 4, d.retransmits)
	})
	b.Run("weir", func(b *testing.B) {
		l := labFor(b, body)
		benchLoad(b, l.Dial, "198.19.0.80:80", body, 4, l.retransmits)
	})
}
