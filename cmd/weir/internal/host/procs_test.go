package host

import (
	"runtime"
	"testing"
)

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
		flag  int
		env   string
		avail int
		want  ProcSettings
	}{
		{"1 CPU", 0, "", 1, ProcSettings{1, "auto"}},
		{"2 CPUs: 1", 0, "", 2, ProcSettings{1, "auto"}},
		{"3 CPUs round up", 0, "", 3, ProcSettings{2, "auto"}},
		{"16 CPUs", 0, "", 16, ProcSettings{8, "auto"}},
		{"the flag", 2, "", 16, ProcSettings{2, "flag"}},
		{"the environment wins", 2, "6", 6, ProcSettings{6, "env"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := DecideProcs(tc.flag, env(tc.env), tc.avail); got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestApplyProcs(t *testing.T) {
	old := runtime.GOMAXPROCS(0)
	defer runtime.GOMAXPROCS(old)
	ApplyProcs(ProcSettings{N: 1, From: "auto"})
	if got := runtime.GOMAXPROCS(0); got != 1 {
		t.Errorf("GOMAXPROCS %d after ApplyProcs, want 1", got)
	}
	// What the environment set is left alone.
	runtime.GOMAXPROCS(2)
	ApplyProcs(ProcSettings{N: 1, From: "env"})
	if got := runtime.GOMAXPROCS(0); got != 2 {
		t.Errorf("GOMAXPROCS %d, want the environment's 2", got)
	}
}
