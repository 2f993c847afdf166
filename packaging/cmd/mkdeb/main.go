// Command mkdeb builds weir's Debian package, weir_<version>_<arch>.deb:
//
//	go run ./packaging/cmd/mkdeb [-o DIR] [-version V]
//
// (`make deb`). It builds the static weir binary with the version in it
// (-ldflags -X main.version), builds a second binary with -tags weirdocs only
// to write the man pages and shell completions from the real command tree,
// and packs them with the files of packaging/ as packaging/nfpm.yaml says,
// using nfpm (github.com/goreleaser/nfpm/v2) as a library: no packaging
// tool needs to be installed. The version comes from git (see debVersion);
// file times are the commit's, so two builds of one commit are identical.
package main

import (
	"bytes"
	"compress/gzip"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/goreleaser/nfpm/v2"
	_ "github.com/goreleaser/nfpm/v2/deb" // registers the deb packager
)

func main() {
	out := flag.String("o", "dist", "write the package into `DIR` (relative to the module root)")
	ver := flag.String("version", "", "the package `VERSION` (default: from git describe)")
	flag.Parse()
	path, err := build(*out, *ver)
	if err != nil {
		fmt.Fprintln(os.Stderr, "mkdeb:", err)
		os.Exit(1)
	}
	fmt.Println(path)
}

// build makes the package in outDir and returns its path.
func build(outDir, version string) (string, error) {
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	if err := os.Chdir(root); err != nil {
		return "", err
	}
	when, err := commitTime()
	if err != nil {
		return "", err
	}
	if version == "" {
		desc, err := output("git", "describe", "--tags", "--always", "--dirty", "--long")
		if err != nil {
			return "", fmt.Errorf("no version from git (give -version): %w", err)
		}
		if version, err = debVersion(desc, when); err != nil {
			return "", err
		}
	} else if !validVersion.MatchString(version) {
		return "", fmt.Errorf("-version %q: not a Debian version without revision (digits first, then [A-Za-z0-9.+~])", version)
	}
	arch, err := output("go", "env", "GOARCH")
	if err != nil {
		return "", err
	}

	stage, err := os.MkdirTemp("", "weir-deb-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(stage)
	if err := stageFiles(stage, version, when); err != nil {
		return "", err
	}

	cfg, err := nfpm.ParseFileWithEnvMapping("packaging/nfpm.yaml", func(k string) string {
		return map[string]string{"VERSION": version, "ARCH": arch, "STAGE": stage}[k]
	})
	if err != nil {
		return "", fmt.Errorf("packaging/nfpm.yaml: %w", err)
	}
	cfg.MTime = when
	info, err := cfg.Get("deb")
	if err != nil {
		return "", err
	}
	pkg, err := nfpm.Get("deb")
	if err != nil {
		return "", err
	}
	if err := nfpm.PrepareForPackager(info, "deb"); err != nil {
		return "", fmt.Errorf("packaging/nfpm.yaml: %w", err)
	}
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return "", err
	}
	path := filepath.Join(outDir, pkg.ConventionalFileName(info))
	var buf bytes.Buffer
	if err := pkg.Package(info, &buf); err != nil {
		return "", fmt.Errorf("deb: %w", err)
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		return "", err
	}
	if !filepath.IsAbs(path) {
		path = filepath.Join(root, path)
	}
	return path, nil
}

// stageFiles builds into stage what the package takes from a build: weir,
// man/*.1.gz and completions/.
func stageFiles(stage, version string, when time.Time) error {
	// -trimpath and -s -w: no build paths or debug tables in a binary that
	// ships; the pclntab stays, so panics still print file:line.
	ldflags := "-s -w -X main.version=" + version
	if err := run([]string{"CGO_ENABLED=0"}, "go", "build", "-trimpath", "-ldflags", ldflags, "-o", filepath.Join(stage, "weir"), "./cmd/weir"); err != nil {
		return err
	}
	docs := filepath.Join(stage, "weir-docs")
	if err := run([]string{"CGO_ENABLED=0"}, "go", "build", "-trimpath", "-tags", "weirdocs", "-ldflags", ldflags, "-o", docs, "./cmd/weir"); err != nil {
		return err
	}
	manSrc := filepath.Join(stage, "man-src")
	if err := run(nil, docs, "gen-docs", "--man", manSrc, "--completions", filepath.Join(stage, "completions"), "--date", when.UTC().Format(time.DateOnly)); err != nil {
		return err
	}
	pages, err := filepath.Glob(filepath.Join(manSrc, "*.1"))
	if err != nil || len(pages) == 0 {
		return fmt.Errorf("gen-docs wrote no man page into %s", manSrc)
	}
	if err := os.Mkdir(filepath.Join(stage, "man"), 0o755); err != nil {
		return err
	}
	for _, p := range pages {
		if err := gzipFile(p, filepath.Join(stage, "man", filepath.Base(p)+".gz")); err != nil {
			return err
		}
	}
	return nil
}

// gzipFile compresses src into dst as `gzip -9n` does: Debian policy wants
// man pages compressed, and no name or time in the header keeps it
// reproducible.
func gzipFile(src, dst string) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if err != nil {
		return err
	}
	if _, err := zw.Write(b); err != nil {
		return err
	}
	if err := zw.Close(); err != nil {
		return err
	}
	return os.WriteFile(dst, buf.Bytes(), 0o644)
}

// validVersion is a Debian upstream version with no revision: it starts
// with a digit and has no hyphen (deb-version(7)).
var validVersion = regexp.MustCompile(`^[0-9][A-Za-z0-9.+~]*$`)

// describeLong is `git describe --long` of a tagged commit: TAG-N-gHASH.
var describeLong = regexp.MustCompile(`^(.+)-([0-9]+)-g([0-9a-f]+)$`)

// commitHash is what `git describe --always` prints without a tag.
var commitHash = regexp.MustCompile(`^[0-9a-f]{4,40}$`)

// debVersion turns `git describe --tags --always --dirty --long` into a
// Debian version that sorts the way the commits do:
//
//	v1.2.3-0-gabc1234      → 1.2.3                      (the tag itself)
//	v1.2.3-4-gabc1234      → 1.2.3+git20261201.4.abc1234 (4 commits after it)
//	v1.3.0-rc1-0-gabc1234  → 1.3.0~rc1                  (sorts before 1.3.0)
//	abc1234                → 0.0~git20261201.abc1234    (no tag yet)
//
// with +dirty (or .dirty) added for uncommitted changes; the date is the
// commit's (UTC).
func debVersion(describe string, commit time.Time) (string, error) {
	desc, dirty := strings.CutSuffix(strings.TrimSpace(describe), "-dirty")
	date := commit.UTC().Format("20060102")
	var v string
	if m := describeLong.FindStringSubmatch(desc); m != nil {
		tag := strings.TrimPrefix(m[1], "v")
		tag = strings.ReplaceAll(tag, "-", "~")
		v = tag
		if n, _ := strconv.Atoi(m[2]); n > 0 {
			v += "+git" + date + "." + m[2] + "." + m[3]
		}
	} else if commitHash.MatchString(desc) {
		v = "0.0~git" + date + "." + desc
	} else {
		return "", fmt.Errorf("git describe %q: neither TAG-N-gHASH nor a commit hash", describe)
	}
	if dirty {
		if strings.Contains(v, "+") {
			v += ".dirty"
		} else {
			v += "+dirty"
		}
	}
	if !validVersion.MatchString(v) {
		return "", fmt.Errorf("git describe %q gives %q, not a Debian version: tag as vX.Y.Z or give -version", describe, v)
	}
	return v, nil
}

// commitTime is HEAD's commit time, or SOURCE_DATE_EPOCH when set.
func commitTime() (time.Time, error) {
	s := os.Getenv("SOURCE_DATE_EPOCH")
	if s == "" {
		var err error
		if s, err = output("git", "log", "-1", "--format=%ct"); err != nil {
			return time.Time{}, fmt.Errorf("commit time (set SOURCE_DATE_EPOCH without git): %w", err)
		}
	}
	sec, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("commit time %q: %w", s, err)
	}
	return time.Unix(sec, 0).UTC(), nil
}

// moduleRoot is the directory of weir's go.mod.
func moduleRoot() (string, error) {
	mod, err := output("go", "env", "GOMOD")
	if err != nil {
		return "", err
	}
	if mod == "" || mod == os.DevNull {
		return "", errors.New("not inside the weir module")
	}
	return filepath.Dir(mod), nil
}

// output runs a command and returns its trimmed stdout.
func output(name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	b, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(string(b)), nil
}

// run runs a command with extra environment, its output on stderr.
func run(env []string, name string, args ...string) error {
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = io.Discard, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %w", name, strings.Join(args, " "), err)
	}
	return nil
}
