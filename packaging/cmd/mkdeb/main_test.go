package main

import (
	"os/exec"
	"testing"
	"time"
)

func TestDebVersion(t *testing.T) {
	day := time.Date(2026, 12, 1, 23, 30, 0, 0, time.FixedZone("x", -5*3600)) // 2026-12-02 UTC
	tests := []struct {
		describe, want string
	}{
		{"v1.2.3-0-gabc1234", "1.2.3"},
		{"1.2.3-0-gabc1234", "1.2.3"},
		{"v1.2.3-4-gabc1234", "1.2.3+git20261202.4.abc1234"},
		{"v1.3.0-rc1-0-gabc1234", "1.3.0~rc1"},
		{"v1.3.0-rc1-2-gabc1234", "1.3.0~rc1+git20261202.2.abc1234"},
		{"abc1234", "0.0~git20261202.abc1234"},
		{"abc1234-dirty", "0.0~git20261202.abc1234+dirty"},
		{"v1.2.3-0-gabc1234-dirty", "1.2.3+dirty"},
		{"v1.2.3-4-gabc1234-dirty\n", "1.2.3+git20261202.4.abc1234.dirty"},
	}
	for _, tt := range tests {
		got, err := debVersion(tt.describe, day)
		if err != nil || got != tt.want {
			t.Errorf("debVersion(%q) = %q, %v; want %q", tt.describe, got, err, tt.want)
		}
	}
	for _, bad := range []string{"release_1-0-gabc1234", "vnext-0-gabc1234", ""} {
		if v, err := debVersion(bad, day); err == nil {
			t.Errorf("debVersion(%q) = %q, want an error", bad, v)
		}
	}
}

// TestDebVersionOrder: the versions sort as the commits do, by dpkg's rules.
func TestDebVersionOrder(t *testing.T) {
	if _, err := exec.LookPath("dpkg"); err != nil {
		t.Skip("skipping: no dpkg to compare versions")
	}
	day := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	// Oldest first: untagged history, a release candidate, the release,
	// commits after it, the next release.
	order := []string{"abc1234", "v0.1.0-0-gabc1234", "v1.0.0-rc1-0-gabc1234", "v1.0.0-rc1-3-gabc1234",
		"v1.0.0-0-gabc1234", "v1.0.0-2-gabc1234", "v1.0.0-10-gabc1234", "v1.0.1-0-gabc1234"}
	var prev string
	for _, d := range order {
		v, err := debVersion(d, day)
		if err != nil {
			t.Fatal(err)
		}
		if prev != "" {
			if err := exec.Command("dpkg", "--compare-versions", prev, "lt", v).Run(); err != nil {
				t.Errorf("dpkg: %s is not older than %s (from %s)", prev, v, d)
			}
		}
		prev = v
	}
}
