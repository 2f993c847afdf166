package host

import (
	"math"
	"runtime/debug"
	"testing"
)

func TestDecideMemory(t *testing.T) {
	// With $GOMEMLIMIT set the runtime has parsed it; DecideMemory reads it
	// back. Pretend it said 300 MiB.
	old := debug.SetMemoryLimit(300 << 20)
	defer debug.SetMemoryLimit(old)
	auto := MemoryLimit{Auto: true}
	tests := []struct {
		name   string
		flag   MemoryLimit
		env    map[string]string
		cgroup int64
		want   MemorySettings
	}{
		{"defaults, no cgroup limit", auto, nil, 0,
			MemorySettings{GOGC: DefaultGOGC, GOGCFrom: "default", Limit: math.MaxInt64, LimitFrom: "none"}},
		{"auto takes 90% of the cgroup", auto, nil, 1 << 30,
			MemorySettings{GOGC: DefaultGOGC, GOGCFrom: "default", Limit: 966367641, LimitFrom: "cgroup"}},
		{"the flag's bytes", MemoryLimit{Bytes: 200 << 20}, nil, 1 << 30,
			MemorySettings{GOGC: DefaultGOGC, GOGCFrom: "default", Limit: 200 << 20, LimitFrom: "flag"}},
		{"none ignores the cgroup", MemoryLimit{}, nil, 1 << 30,
			MemorySettings{GOGC: DefaultGOGC, GOGCFrom: "default", Limit: math.MaxInt64, LimitFrom: "none"}},
		{"GOGC from the environment", auto, map[string]string{"GOGC": "100"}, 0,
			MemorySettings{GOGC: 100, GOGCFrom: "env", Limit: math.MaxInt64, LimitFrom: "none"}},
		{"GOGC=off", auto, map[string]string{"GOGC": "off"}, 0,
			MemorySettings{GOGC: -1, GOGCFrom: "env", Limit: math.MaxInt64, LimitFrom: "none"}},
		{"GOMEMLIMIT beats the flag", MemoryLimit{Bytes: 200 << 20}, map[string]string{"GOMEMLIMIT": "300MiB"}, 1 << 30,
			MemorySettings{GOGC: DefaultGOGC, GOGCFrom: "default", Limit: 300 << 20, LimitFrom: "env"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := DecideMemory(tc.flag, func(k string) string { return tc.env[k] }, tc.cgroup)
			if got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestApplyMemory(t *testing.T) {
	oldGC := debug.SetGCPercent(100)
	oldLimit := debug.SetMemoryLimit(math.MaxInt64)
	defer func() {
		debug.SetGCPercent(oldGC)
		debug.SetMemoryLimit(oldLimit)
	}()
	ApplyMemory(MemorySettings{GOGC: 50, GOGCFrom: "default", Limit: 256 << 20, LimitFrom: "flag"})
	if got := debug.SetGCPercent(50); got != 50 {
		t.Errorf("GOGC %d after ApplyMemory, want 50", got)
	}
	if got := debug.SetMemoryLimit(-1); got != 256<<20 {
		t.Errorf("memory limit %d after ApplyMemory, want %d", got, 256<<20)
	}
	// What the environment set is left alone.
	debug.SetGCPercent(80)
	debug.SetMemoryLimit(300 << 20)
	ApplyMemory(MemorySettings{GOGC: 80, GOGCFrom: "env", Limit: 300 << 20, LimitFrom: "env"})
	if got := debug.SetGCPercent(80); got != 80 {
		t.Errorf("GOGC %d, want the environment's 80", got)
	}
	if got := debug.SetMemoryLimit(-1); got != 300<<20 {
		t.Errorf("memory limit %d, want the environment's", got)
	}
}

func TestParseCgroupBytes(t *testing.T) {
	tests := []struct {
		in   string
		want int64
		err  bool
	}{
		{"max\n", 0, false},
		{"9223372036854771712\n", 0, false}, // v1 "unlimited"
		{"1073741824\n", 1 << 30, false},
		{"0", 0, true},
		{"lots", 0, true},
	}
	for _, tc := range tests {
		got, err := parseCgroupBytes(tc.in)
		if (err != nil) != tc.err || got != tc.want {
			t.Errorf("parseCgroupBytes(%q) = %d, %v; want %d, error %v", tc.in, got, err, tc.want, tc.err)
		}
	}
}
