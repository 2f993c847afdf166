package host

// How many CPUs weir run's Go code uses at once (GOMAXPROCS, --procs).
//
// Every packet through weir costs the kernel about as much again as it
// costs weir's Go code: a TUN write carries the packet through the kernel's
// routing into the client's TCP, a write to a target's socket through the
// kernel's TCP and the veth into the target's. That work runs in weir's
// syscalls, on the thread that made them, while the Go scheduler hands the
// P to another thread. With one P per core, those Ps have no core of their
// own: the runtime wakes threads that find the cores busy, spins and parks
// them again (sysmon, futex, nanosleep were a tenth of weir's CPU at 4 000
// connections/s). With half the cores as Ps, the same work costs less. See
// docs/performance.md (the changes of the current round) for the
// measurements.

import "runtime"

// ProcSettings is the GOMAXPROCS weir runs with and where it came from,
// for the start log.
type ProcSettings struct {
	N    int
	From string // "env" ($GOMAXPROCS), "flag" or "auto"
}

// DecideProcs chooses GOMAXPROCS: the environment first, then flag (a
// count; 0 means auto),
// then half of avail, the runtime's own default (which honours the CPU
// affinity mask and a cgroup CPU limit), rounded up. It changes nothing;
// ApplyProcs does.
func DecideProcs(flag int, getenv func(string) string, avail int) ProcSettings {
	switch {
	case getenv("GOMAXPROCS") != "":
		return ProcSettings{N: avail, From: "env"}
	case flag > 0:
		return ProcSettings{N: flag, From: "flag"}
	}
	return ProcSettings{N: max((avail+1)/2, 1), From: "auto"}
}

// ApplyProcs puts s into effect; what came from the environment the
// runtime has already applied. Setting it stops the runtime from following
// later changes of the cgroup's CPU limit.
func ApplyProcs(s ProcSettings) {
	if s.From != "env" {
		runtime.GOMAXPROCS(s.N)
	}
}
