package main

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
// the README's Performance section for the measurements.

import (
	"fmt"
	"runtime"
	"strconv"
	"strings"
)

// procsFlag is --procs: auto (half the CPUs the runtime found, at least
// one) or a count.
type procsFlag struct {
	n int // 0: auto
}

func (p *procsFlag) String() string {
	if p.n == 0 {
		return "auto"
	}
	return strconv.Itoa(p.n)
}

func (p *procsFlag) Set(s string) error {
	s = strings.TrimSpace(s)
	if s == "auto" {
		p.n = 0
		return nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > 1024 {
		return fmt.Errorf("want auto or a count from 1 to 1024, not %q", s)
	}
	p.n = n
	return nil
}

func (p *procsFlag) Type() string { return "procs" }

// procSettings is the GOMAXPROCS weir runs with and where it came from,
// for the start log.
type procSettings struct {
	N    int
	From string // "env" ($GOMAXPROCS), "flag" or "auto"
}

// decideProcs chooses GOMAXPROCS: the environment first, then the flag,
// then half of avail, the runtime's own default (which honours the CPU
// affinity mask and a cgroup CPU limit), rounded up. It changes nothing;
// applyProcs does.
func decideProcs(flag procsFlag, getenv func(string) string, avail int) procSettings {
	switch {
	case getenv("GOMAXPROCS") != "":
		return procSettings{N: avail, From: "env"}
	case flag.n > 0:
		return procSettings{N: flag.n, From: "flag"}
	}
	return procSettings{N: max((avail+1)/2, 1), From: "auto"}
}

// applyProcs puts s into effect; what came from the environment the
// runtime has already applied. Setting it stops the runtime from following
// later changes of the cgroup's CPU limit.
func applyProcs(s procSettings) {
	if s.From != "env" {
		runtime.GOMAXPROCS(s.N)
	}
}
