package weir_test

import (
	"bytes"
	"encoding/json"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestThirdPartyGVisor pins what third_party/gvisor is (go.mod replaces
// gvisor.dev/gvisor with it): gVisor at the version go.mod requires, the
// packages weir builds, byte for byte, except the files that
// third_party/patches/gvisor-*.patch change, each of which is upstream
// with those patches applied. So the copy can be refreshed
// (scripts/gvisor-sync.sh) and every change to gVisor is a patch file that
// says why. Upstream comes from the module cache (go mod download).
func TestThirdPartyGVisor(t *testing.T) {
	gomod, err := os.ReadFile("go.mod")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s*gvisor\.dev/gvisor (v\S+)`).FindSubmatch(gomod)
	if m == nil {
		t.Fatal("go.mod requires no gvisor.dev/gvisor version")
	}
	if !bytes.Contains(gomod, []byte("replace gvisor.dev/gvisor => ./third_party/gvisor")) {
		t.Fatal("go.mod does not replace gvisor.dev/gvisor with ./third_party/gvisor")
	}
	out, err := exec.Command("go", "mod", "download", "-json", "gvisor.dev/gvisor@"+string(m[1])).Output()
	if err != nil {
		t.Skipf("skipping: upstream gVisor %s not at hand (go mod download: %v)", m[1], err)
	}
	var dl struct{ Dir string }
	if err := json.Unmarshal(out, &dl); err != nil || dl.Dir == "" {
		t.Fatalf("go mod download: %v %s", err, out)
	}

	// The files the patches change.
	patches, _ := filepath.Glob("third_party/patches/gvisor-*.patch")
	if len(patches) == 0 {
		t.Fatal("no third_party/patches/gvisor-*.patch: without a patch the copy has no reason to exist")
	}
	var patched []string
	for _, p := range patches {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range regexp.MustCompile(`(?m)^\+\+\+ b/(\S+)`).FindAllSubmatch(b, -1) {
			patched = append(patched, string(f[1]))
		}
	}

	// Every other file is upstream's.
	const copyDir = "third_party/gvisor"
	var differ []string
	err = filepath.WalkDir(copyDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(copyDir, path)
		mine, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		up, err := os.ReadFile(filepath.Join(dl.Dir, rel))
		if err != nil {
			t.Errorf("%s: not in upstream gVisor %s", rel, m[1])
			return nil
		}
		if !bytes.Equal(mine, up) {
			differ = append(differ, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(differ)
	slices.Sort(patched)
	patched = slices.Compact(patched)
	if !slices.Equal(differ, patched) {
		t.Fatalf("files that differ from upstream %v, files the patches change %v: a change to gVisor without its patch, or a patch not applied", differ, patched)
	}

	// Taking the patches back out of a copy of those files gives upstream.
	tmp := t.TempDir()
	for _, rel := range patched {
		b, err := os.ReadFile(filepath.Join(copyDir, rel))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Join(tmp, filepath.Dir(rel)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(tmp, rel), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for i := len(patches) - 1; i >= 0; i-- {
		abs, _ := filepath.Abs(patches[i])
		cmd := exec.Command("git", "apply", "-R", abs)
		cmd.Dir = tmp
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s does not come back out of third_party/gvisor: %v\n%s", patches[i], err, strings.TrimSpace(string(out)))
		}
	}
	for _, rel := range patched {
		got, _ := os.ReadFile(filepath.Join(tmp, rel))
		up, _ := os.ReadFile(filepath.Join(dl.Dir, rel))
		if !bytes.Equal(got, up) {
			t.Errorf("%s: with the patches taken out it is not upstream's: the copy holds more than the patches", rel)
		}
	}
}
