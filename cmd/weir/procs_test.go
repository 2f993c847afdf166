package main

import (
	"runtime"
	"testing"
)

func TestProcsFlag(t *testing.T) {
	var p procsFlag
	for _, bad := range []string{"", "0", "-1", "two", "2000"} {
		if err := p.Set(bad); err == nil {
			t.Errorf("--procs %q accepted", bad)
		}
	}
	if err := p.Set("3"); err != nil || p.n != 3 || p.String() != "3" {
		t.Errorf("--procs 3: %v, %+v", err, p)
	}
	if err := p.Set("auto"); err != nil || p.n != 0 || p.String() != "auto" {
		t.Errorf("--procs auto: %v, %+v", err, p)
	}
}

func TestDecideProcs(t *testing.T) {
	env := func(v string) func(string) string {
		return func(k string) string {
			if k == "GOMAXPROCS" {
				return v
			}
			return ""
		}
	}
	tests := []struct {
		name  string
		flag  procsFlag
		env   string
		avail int
		want  procSettings
	}{
		{"1 CPU", procsFlag{}, "", 1, procSettings{1, "auto"}},
		{"2 CPUs: 1", procsFlag{}, "", 2, procSettings{1, "auto"}},
		{"3 CPUs round up", procsFlag{}, "", 3, procSettings{2, "auto"}},
		{"16 CPUs", procsFlag{}, "", 16, procSettings{8, "auto"}},
		{"the flag", procsFlag{n: 2}, "", 16, procSettings{2, "flag"}},
		{"the environment wins", procsFlag{n: 2}, "6", 6, procSettings{6, "env"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := decideProcs(tc.flag, env(tc.env), tc.avail); got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestApplyProcs(t *testing.T) {
	old := runtime.GOMAXPROCS(0)
	defer runtime.GOMAXPROCS(old)
	applyProcs(procSettings{N: 1, From: "auto"})
	if got := runtime.GOMAXPROCS(0); got != 1 {
		t.Errorf("GOMAXPROCS %d after applyProcs, want 1", got)
	}
	// What the environment set is left alone.
	runtime.GOMAXPROCS(2)
	applyProcs(procSettings{N: 1, From: "env"})
	if got := runtime.GOMAXPROCS(0); got != 2 {
		t.Errorf("GOMAXPROCS %d, want the environment's 2", got)
	}
}
