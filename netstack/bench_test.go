package netstack

import (
	"fmt"
	"io"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"weir/policy"
)

// cpuTime returns the process's user plus system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// benchRig is a client stack, weir (front and back arm) and a target, all in
// memory (or the target on host loopback).
func benchRig(b testing.TB, host bool, handle func(net.Conn)) (*rig, netip.AddrPort) {
	vs := &policy.VirtualServer{Name: "bench", VIPs: []netip.Addr{vipV4}, Ports: policy.PortRange{Lo: 80, Hi: 80}}
	var target *policy.Target
	var back *backArm
	if host {
		l, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(serveListener(l, handle))
		target = &policy.Target{Name: "host", Addr: l.Addr().(*net.TCPAddr).AddrPort()}
	} else {
		back = newBackArm(b)
		tg := back.addTarget(b, 1, false, nil, handle)
		target = &policy.Target{Name: "back", Addr: tg.addr, Via: policy.DialNetstack}
	}
	fo := fwdOptions{Services: services(vs), Admitter: &testAdmitter{target: target}}
	if back != nil {
		fo.Back = &StackDialer{Stack: back.s}
	}
	return newRig(b, rigOptions{fwd: fo}), netip.AddrPortFrom(vipV4, 80)
}

// BenchmarkBulk measures one connection's upload throughput client → weir →
// target through memory pairs. CPU is the whole process: the client stack,
// weir's two stacks and (for the netstack target) the target's stack.
func BenchmarkBulk(b *testing.B) {
	for _, host := range []bool{false, true} {
		name := "target=netstack"
		if host {
			name = "target=host"
		}
		b.Run(name, func(b *testing.B) {
			r, vip := benchRig(b, host, sinkHandler)
			c := dial(b, r.client, vip)
			defer c.Close()
			chunk := make([]byte, 64<<10)
			b.SetBytes(int64(len(chunk)))
			b.ReportAllocs()
			cpu0, t0 := cpuTime(), time.Now()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := c.Write(chunk); err != nil {
					b.Fatal(err)
				}
			}
			c.CloseWrite()
			reply, err := io.ReadAll(c)
			b.StopTimer()
			if want := fmt.Sprintf("%d\n", b.N*len(chunk)); err != nil || string(reply) != want {
				b.Fatalf("sink saw %q, want %q (%v)", reply, want, err)
			}
			el, cpu := time.Since(t0), cpuTime()-cpu0
			mb := float64(b.N*len(chunk)) / 1e6
			b.ReportMetric(mb/el.Seconds(), "MB/s")
			b.ReportMetric(float64(cpu.Milliseconds())/mb, "cpu-ms/MB")
		})
	}
}

// BenchmarkConnRate measures new connections per second: each iteration
// opens a connection through weir, receives a short answer and closes (the
// target closes first). CPU is the whole process, as in BenchmarkBulk.
func BenchmarkConnRate(b *testing.B) {
	for _, host := range []bool{false, true} {
		name := "target=netstack"
		if host {
			name = "target=host"
		}
		b.Run(name, func(b *testing.B) {
			r, vip := benchRig(b, host, func(c net.Conn) {
				c.Write([]byte("bye\n"))
				c.Close()
			})
			b.ReportAllocs()
			cpu0, t0 := cpuTime(), time.Now()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				c, err := dialRetryBind(r.client, netip.AddrPort{}, vip)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := io.ReadAll(c); err != nil {
					b.Fatal(err)
				}
				c.Close()
			}
			b.StopTimer()
			el, cpu := time.Since(t0), cpuTime()-cpu0
			b.ReportMetric(float64(b.N)/el.Seconds(), "conns/s")
			b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/conn")
		})
	}
}
