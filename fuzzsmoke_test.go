package weir_test

import (
	"bufio"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestFuzzSmokeFindsEveryTarget: scripts/fuzz-smoke.sh (make fuzz-smoke,
// run by CI) lists every Fuzz function of the module's test files, so a
// new fuzz target is run without anyone editing the script.
func TestFuzzSmokeFindsEveryTarget(t *testing.T) {
	if testing.Short() {
		t.Skip("skipping: compiles every package's tests")
	}
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("skipping: no bash")
	}
	fuzzFunc := regexp.MustCompile(`^func (Fuzz[A-Za-z0-9_]*)\(`)
	var want []string
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			if m := fuzzFunc.FindStringSubmatch(sc.Text()); m != nil {
				want = append(want, "weir/"+filepath.ToSlash(filepath.Dir(path))+" "+m[1])
			}
		}
		return sc.Err()
	})
	if err != nil {
		t.Fatal(err)
	}
	for i, w := range want {
		want[i] = strings.Replace(w, "weir/. ", "weir ", 1)
	}
	out, err := exec.Command("bash", "scripts/fuzz-smoke.sh", "--list").CombinedOutput()
	if err != nil {
		t.Fatalf("fuzz-smoke.sh --list: %v\n%s", err, out)
	}
	got := strings.Split(strings.TrimSpace(string(out)), "\n")
	slices.Sort(got)
	slices.Sort(want)
	if len(want) == 0 || !slices.Equal(got, want) {
		t.Errorf("fuzz-smoke.sh lists\n%s\nthe test files define\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
