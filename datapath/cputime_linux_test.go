//go:build linux

package datapath

import (
	"runtime"
	"syscall"
	"time"
)

// threadCPU locks the calling goroutine to its thread and returns a
// function reporting the CPU time that thread has used since: benchmarks
// report it beside wall time, because on a shared, loaded host wall time
// counts the time other processes held the core.
func threadCPU() func() time.Duration {
	runtime.LockOSThread()
	start := rusageThread()
	return func() time.Duration {
		d := rusageThread() - start
		runtime.UnlockOSThread()
		return d
	}
}

func rusageThread() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(1 /* RUSAGE_THREAD */, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
