package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCheckCluster(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "c.yaml")
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(good, []byte("cluster: {redis: \"redis://u:secret@10.0.0.5:6379/0\", name: edge, instance: a, leaseInterval: 500ms}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bad, []byte("cluster: {name: edge, onRedisDown: maybe}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errs := run("check", "-c", good)
	if code != 0 || errs != "" {
		t.Fatalf("exit %d, stderr %q", code, errs)
	}
	for _, w := range []string{
		"cluster edge: instance a, redis redis://u:xxxxx@10.0.0.5:6379/0\n",
		"  enforced connection limits shared through leases renewed every 500ms (a dead instance's slots free after 1.5s)\n",
		"  Redis unreachable: localShare (each instance enforces limit ÷ live members)\n",
	} {
		if !strings.Contains(out, w) {
			t.Errorf("summary lacks %q:\n%s", w, out)
		}
	}
	if strings.Contains(out, "secret") {
		t.Errorf("summary shows the Redis password:\n%s", out)
	}
	code, _, errs = run("check", "-c", bad)
	want := bad + ":1:10: cluster: missing \"redis\"\n" +
		bad + ":1:36: onRedisDown: unknown onRedisDown \"maybe\" (want localShare, failOpen or failClosed)\n"
	if code != 1 || !strings.HasPrefix(errs, want) {
		t.Errorf("exit %d, stderr\n%s\nwant prefix\n%s", code, errs, want)
	}
	// No cluster section: no cluster line (the summary is today's).
	_, out, _ = run("check", "-c", "../../examples/zos-telnet.pa")
	if strings.Contains(out, "cluster") {
		t.Errorf("summary of a config without cluster mentions one:\n%s", out)
	}
}
