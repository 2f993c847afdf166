package main

// weir run's flags for the host settings (internal/host decides and applies
// them): --memory-limit and --procs.

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"weir/cmd/weir/internal/host"
)

// memoryLimit is --memory-limit: auto (a fraction of the cgroup's memory
// limit, none without one), none, or a byte count.
type memoryLimit struct {
	auto  bool
	bytes int64 // with auto false: the limit; 0 means none
}

func (m *memoryLimit) String() string {
	switch {
	case m.auto:
		return "auto"
	case m.bytes == 0:
		return "none"
	}
	n := m.bytes
	return byteSize{&n}.String()
}

func (m *memoryLimit) Set(s string) error {
	switch strings.TrimSpace(s) {
	case "auto":
		*m = memoryLimit{auto: true}
		return nil
	case "none", "0":
		*m = memoryLimit{}
		return nil
	}
	var n int64
	if err := (byteSize{&n}).Set(s); err != nil {
		return fmt.Errorf("want auto, none or a byte count like 512MiB: %w", err)
	}
	if n < 16<<20 {
		return fmt.Errorf("%s is below 16MiB: the GC would run all the time", s)
	}
	*m = memoryLimit{bytes: n}
	return nil
}

func (m *memoryLimit) Type() string { return "limit" }

// limit is what the flag asks of host.DecideMemory.
func (m *memoryLimit) limit() host.MemoryLimit {
	return host.MemoryLimit{Auto: m.auto, Bytes: m.bytes}
}

// limitText is s's limit for the log: "none" or a byte count.
func limitText(s host.MemorySettings) string {
	if s.Limit == math.MaxInt64 {
		return "none"
	}
	n := s.Limit
	return byteSize{&n}.String()
}

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
