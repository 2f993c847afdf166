package hostcap

import (
	"net/netip"
	"syscall"
	"testing"
	"time"
)

// cpuNow is the process's user+system CPU time.
func cpuNow() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkCaptureCost measures the CPU the process spends per GB of one
// upload stream through the lab (sender, receiver and router all in this
// process's namespaces, so the absolute figure is the whole path's), with
// the capture on and off in the same run: the difference is the
// capture's cost (its reader, and the kernel's filter and copies, where
// they are charged to this process). gso: the host's interface sends TSO
// super-packets (one captured packet for many segments); segments:
// gso_max_segs 1, one packet per segment. Run as root: go test -run '^$'
// -bench CaptureCost ./datapath/hostcap/
func BenchmarkCaptureCost(b *testing.B) {
	for _, tc := range []struct {
		name    string
		gso, on bool
	}{{"gso/off", true, false}, {"gso/on", true, true}, {"segments/off", false, false}, {"segments/on", false, true}} {
		on := tc.on
		b.Run(tc.name, func(b *testing.B) {
			l := newLab(b, tc.gso)
			target := netip.MustParseAddrPort("198.18.6.2:9000")
			if on {
				l.open(Options{}, target)
			}
			const size = 256 << 20
			b.ResetTimer()
			c0, w0 := cpuNow(), time.Now()
			for i := 0; i < b.N; i++ {
				l.transfer(target, 1, size, true)
			}
			cpu, wall := cpuNow()-c0, time.Since(w0)
			gb := float64(b.N) * size / 1e9
			b.ReportMetric(cpu.Seconds()/gb, "cpu-s/GB")
			b.ReportMetric(gb*8/wall.Seconds(), "Gbit/s")
		})
	}
}

// BenchmarkCaptureCostConns measures the CPU per connection of 16
// concurrent connections moving 64 KiB each (the capture's per-flow cost:
// its table, the SYN and FIN, the short flows' segments), capture on and
// off in the same run.
func BenchmarkCaptureCostConns(b *testing.B) {
	for _, on := range []bool{false, true} {
		name := "c16/off"
		if on {
			name = "c16/on"
		}
		b.Run(name, func(b *testing.B) {
			l := newLab(b, true)
			target := netip.MustParseAddrPort("198.18.6.2:9000")
			if on {
				l.open(Options{}, target)
			}
			b.ResetTimer()
			c0 := cpuNow()
			for i := 0; i < b.N; i++ {
				l.transfer(target, 16, 64<<10, true)
			}
			b.ReportMetric(float64((cpuNow()-c0).Microseconds())/float64(16*b.N), "cpu-us/conn")
		})
	}
}
