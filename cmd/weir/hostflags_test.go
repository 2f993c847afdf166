package main

import (
	"strings"
	"testing"
)

func TestMemoryLimitFlag(t *testing.T) {
	tests := []struct {
		in, want, err string
	}{
		{in: "auto", want: "auto"},
		{in: "none", want: "none"},
		{in: "0", want: "none"},
		{in: "512MiB", want: "512MiB"},
		{in: "1GiB", want: "1GiB"},
		{in: "1MiB", err: "below 16MiB"},
		{in: "lots", err: "want auto, none or a byte count"},
		{in: "-5MiB", err: "want auto, none or a byte count"},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			var m memoryLimit
			err := m.Set(tc.in)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("Set(%q) = %v, want an error with %q", tc.in, err, tc.err)
				}
				return
			}
			if err != nil || m.String() != tc.want {
				t.Fatalf("Set(%q): %v, String %q, want %q", tc.in, err, m.String(), tc.want)
			}
		})
	}
}

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

func TestRunRefusesBadMemoryLimit(t *testing.T) {
	code, _, errs := run("run", "-c", "../../examples/sun-qos.yaml", "--memory-limit", "1MiB")
	if code != 1 || !strings.Contains(errs, `invalid argument "1MiB" for "--memory-limit"`) || !strings.Contains(errs, "below 16MiB") {
		t.Errorf("exit %d, stderr %q", code, errs)
	}
}
