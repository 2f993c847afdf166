package host

// The Go runtime's memory settings for weir run: the GC's target (GOGC) and
// a soft memory limit (GOMEMLIMIT, --memory-limit). Most of weir's resident
// memory above its live data is heap the collector lets grow between cycles
// (with GOGC=100, up to twice the live heap plus the goroutine stacks) and
// keeps resident afterwards; both settings bound that slack. The
// environment variables always win: the runtime has applied them before
// main, and weir then leaves the setting alone.

import (
	"bufio"
	"errors"
	"fmt"
	"math"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
)

// DefaultGOGC is the GC target weir run sets when $GOGC is not set. See
// docs/operations.md (Memory: GOGC and the memory limit) and
// docs/bench/2026-12-01-1217.md for the measurement behind it.
const DefaultGOGC = 50

// AutoLimitFraction is the share of the cgroup's memory limit that
// --memory-limit auto gives the Go runtime: the rest is for what the
// runtime does not count (the kernel's socket buffers charged to the
// cgroup, the binary's pages) so that the GC works harder before the
// kernel's OOM killer steps in.
const AutoLimitFraction = 0.9

// MemoryLimit is what --memory-limit asks for: auto (a fraction of the
// cgroup's memory limit, none without one), none (Auto false, Bytes 0), or
// Bytes.
type MemoryLimit struct {
	Auto  bool
	Bytes int64 // with Auto false: the limit; 0 means none
}

// MemorySettings are the GC settings weir runs with and where each came
// from, for the start log.
type MemorySettings struct {
	GOGC      int    // percent; -1: the GC is off (GOGC=off)
	GOGCFrom  string // "env" ($GOGC) or "default"
	Limit     int64  // bytes; math.MaxInt64: none
	LimitFrom string // "env" ($GOMEMLIMIT), "flag", "cgroup" (auto) or "none"
}

// DecideMemory chooses the settings: the environment first, then the flag,
// then the defaults. cgroupLimit is the cgroup's memory limit in bytes (0:
// none). It changes nothing; ApplyMemory does.
func DecideMemory(flag MemoryLimit, getenv func(string) string, cgroupLimit int64) MemorySettings {
	s := MemorySettings{GOGC: DefaultGOGC, GOGCFrom: "default", Limit: math.MaxInt64, LimitFrom: "none"}
	if v := getenv("GOGC"); v != "" {
		s.GOGCFrom = "env"
		s.GOGC = 100 // what the runtime makes of a value it cannot parse
		if v == "off" {
			s.GOGC = -1
		} else if n, err := strconv.Atoi(v); err == nil {
			s.GOGC = n
		}
	}
	switch {
	case getenv("GOMEMLIMIT") != "":
		s.LimitFrom = "env"
		s.Limit = debug.SetMemoryLimit(-1) // the runtime parsed it: read it back
	case !flag.Auto && flag.Bytes > 0:
		s.Limit, s.LimitFrom = flag.Bytes, "flag"
	case flag.Auto && cgroupLimit > 0:
		s.Limit, s.LimitFrom = int64(float64(cgroupLimit)*AutoLimitFraction), "cgroup"
	}
	return s
}

// ApplyMemory puts s into effect; what came from the environment the
// runtime has already applied.
func ApplyMemory(s MemorySettings) {
	if s.GOGCFrom != "env" {
		debug.SetGCPercent(s.GOGC)
	}
	if s.LimitFrom != "env" {
		debug.SetMemoryLimit(s.Limit)
	}
}

// CgroupMemoryLimit is the memory limit of the cgroup this process runs
// in, in bytes: cgroup v2's memory.max or v1's memory.limit_in_bytes; 0
// when there is none (unlimited, or no cgroup file to read).
func CgroupMemoryLimit() int64 {
	f, err := os.Open("/proc/self/cgroup")
	if err != nil {
		return 0
	}
	defer f.Close()
	var v1, v2 string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// hierarchy-ID:controllers:path
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		switch {
		case parts[0] == "0" && parts[1] == "":
			v2 = parts[2]
		case strings.Contains(","+parts[1]+",", ",memory,"):
			v1 = parts[2]
		}
	}
	if v1 != "" {
		if n, err := readCgroupBytes("/sys/fs/cgroup/memory" + v1 + "/memory.limit_in_bytes"); err == nil {
			return n
		}
		if n, err := readCgroupBytes("/sys/fs/cgroup/memory/memory.limit_in_bytes"); err == nil {
			return n // the namespace's root: the path above is the host's view
		}
	}
	if v2 != "" {
		if n, err := readCgroupBytes("/sys/fs/cgroup" + v2 + "/memory.max"); err == nil {
			return n
		}
		if n, err := readCgroupBytes("/sys/fs/cgroup/memory.max"); err == nil {
			return n
		}
	}
	return 0
}

// readCgroupBytes reads a cgroup memory limit file: "max" or a number at
// or above 2^62 (v1's "unlimited" is a page-rounded 2^63-1) mean none (0).
func readCgroupBytes(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return parseCgroupBytes(string(b))
}

func parseCgroupBytes(s string) (int64, error) {
	s = strings.TrimSpace(s)
	if s == "max" {
		return 0, nil
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("cgroup memory limit %q: %w", s, err)
	}
	if n == 0 {
		return 0, errors.New("cgroup memory limit 0")
	}
	if n >= 1<<62 {
		return 0, nil
	}
	return int64(n), nil
}
