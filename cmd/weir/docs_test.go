package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"

	"weir/cmd/weir/internal/metrics"
)

var update = flag.Bool("update", false, "rewrite the generated sections of docs/")

// The module's root, seen from this package's directory.
const root = "../.."

// generatedSection is a part of a document written from the code: it lies
// between "<!-- name:begin -->" and "<!-- name:end -->" lines of file.
type generatedSection struct {
	file, name string
	want       func(t *testing.T) string
}

var generatedSections = []generatedSection{
	// The configuration reference is the parser's documentation
	// (policy/config/doc.go, what `go doc weir/policy/config` prints).
	{"docs/configuration.md", "config-reference", func(t *testing.T) string {
		doc, err := os.ReadFile(filepath.Join(root, "policy/config/doc.go"))
		if err != nil {
			t.Fatal(err)
		}
		return configReference(string(doc))
	}},
	// The metrics table is the metric definitions (internal/metrics.Defs).
	{"docs/operations.md", "metrics", func(*testing.T) string { return metricsTable() }},
}

// TestDocsGenerated keeps docs/configuration.md's configuration reference
// identical to the parser's documentation and docs/operations.md's metrics
// table identical to the metric definitions. Run `go test ./cmd/weir -run
// DocsGenerated -update` after changing either.
func TestDocsGenerated(t *testing.T) {
	for _, s := range generatedSections {
		path := filepath.Join(root, s.file)
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		text, changed, err := syncSection(string(b), s.name, s.want(t))
		switch {
		case err != nil:
			t.Errorf("%s: %v", s.file, err)
		case changed && *update:
			if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
				t.Fatal(err)
			}
		case changed:
			t.Errorf("%s: section %s is out of date: run go test ./cmd/weir -run DocsGenerated -update", s.file, s.name)
		}
	}
	// A generated section lives in one document only: a stale copy
	// elsewhere (the README held both once) would drift unchecked.
	for _, doc := range markdownFiles(t) {
		b, err := os.ReadFile(filepath.Join(root, doc))
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range generatedSections {
			if doc != s.file && strings.Contains(string(b), "<!-- "+s.name+":begin -->") {
				t.Errorf("%s has a copy of section %s, which is generated into %s only", doc, s.name, s.file)
			}
		}
	}
}

// TestDocsGeneratedDetectsDrift: the check above fails on a reference that
// drifted by one line, and on a document that lost its markers.
func TestDocsGeneratedDetectsDrift(t *testing.T) {
	for _, s := range generatedSections {
		want := s.want(t)
		if !strings.Contains(want, "\n") || len(want) < 100 {
			t.Fatalf("section %s generates almost nothing (%d bytes)", s.name, len(want))
		}
		doc := "# x\n\n<!-- " + s.name + ":begin -->\n" + want + "<!-- " + s.name + ":end -->\nafter\n"
		if _, changed, err := syncSection(doc, s.name, want); err != nil || changed {
			t.Errorf("%s: an up-to-date section reads changed=%v err=%v", s.name, changed, err)
		}
		// One line of the reference edited in the document.
		body := strings.Index(doc, ":begin -->\n") + len(":begin -->\n")
		i := body + strings.Index(doc[body:], "\n")
		drifted := doc[:i] + " (edited)" + doc[i:]
		got, changed, err := syncSection(drifted, s.name, want)
		if err != nil || !changed {
			t.Errorf("%s: a drifted section reads changed=%v err=%v", s.name, changed, err)
		}
		if got != doc {
			t.Errorf("%s: -update does not restore the generated text", s.name)
		}
		// The code's side drifting: a new line in the reference.
		if _, changed, _ := syncSection(doc, s.name, want+"| new |\n"); !changed {
			t.Errorf("%s: a longer reference than the document's reads unchanged", s.name)
		}
		if _, _, err := syncSection("# x\nno markers\n", s.name, want); err == nil {
			t.Errorf("%s: a document without markers passes", s.name)
		}
	}
}

// syncSection returns text with the section name holding want, and whether
// that differs from text.
func syncSection(text, name, want string) (string, bool, error) {
	begin, end := "<!-- "+name+":begin -->\n", "<!-- "+name+":end -->"
	i, j := strings.Index(text, begin), strings.Index(text, end)
	if i < 0 || j < i {
		return "", false, fmt.Errorf("no %s markers", name)
	}
	if strings.Count(text, begin) != 1 || strings.Count(text, end) != 1 {
		return "", false, fmt.Errorf("the %s markers appear more than once", name)
	}
	if text[i+len(begin):j] == want {
		return text, false, nil
	}
	return text[:i+len(begin)] + want + text[j:], true, nil
}

// TestREADMEShort: the README stays an entrance (what weir is, the two
// commands, quick start, install, links); the manual is docs/.
func TestREADMEShort(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(b), "\n"); n > 300 {
		t.Errorf("README.md has %d lines, more than 300: move the detail into docs/", n)
	}
	first := strings.Index(string(b), "make demo")
	if first < 0 || first > strings.Index(string(b), "\n## ") || !strings.Contains(string(b)[first:], "make test") {
		t.Errorf("README.md no longer opens with make demo and make test")
	}
}

// TestDocsLinks: every relative link of the README, SECURITY.md and docs/
// names a file of the repository, and every #anchor a heading of its
// document (GitHub's heading slugs).
func TestDocsLinks(t *testing.T) {
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	for _, doc := range markdownFiles(t) {
		for _, l := range links(t, doc, link) {
			n, target := l.line, l.target
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			file, anchor, _ := strings.Cut(target, "#")
			path := filepath.Join(filepath.Dir(doc), file)
			if file == "" {
				path = doc
			}
			if _, err := os.Stat(filepath.Join(root, path)); err != nil {
				t.Errorf("%s:%d: link %s: %v", doc, n, target, err)
				continue
			}
			if anchor == "" {
				continue
			}
			if !strings.HasSuffix(path, ".md") {
				t.Errorf("%s:%d: link %s: an anchor into a file that is not Markdown", doc, n, target)
				continue
			}
			if !anchors(t, path)[anchor] {
				t.Errorf("%s:%d: link %s: %s has no heading #%s", doc, n, target, path, anchor)
			}
		}
	}
}

func TestHeadingSlug(t *testing.T) {
	for in, want := range map[string]string{
		"What weir does, and where it comes from":     "what-weir-does-and-where-it-comes-from",
		"Running `weir run`":                          "running-weir-run",
		"The last round: fewer Ps, shorter TIME_WAIT": "the-last-round-fewer-ps-shorter-time_wait",
		"README → docs/":                              "readme--docs",
	} {
		if got := headingSlug(in); got != want {
			t.Errorf("headingSlug(%q) = %q, want %q", in, got, want)
		}
	}
}

// markdownFiles lists the README, SECURITY.md and every .md under docs/,
// relative to the module's root.
func markdownFiles(t *testing.T) []string {
	files := []string{"README.md", "SECURITY.md"}
	err := filepath.WalkDir(filepath.Join(root, "docs"), func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(p, ".md") {
			rel, err := filepath.Rel(root, p)
			if err != nil {
				return err
			}
			files = append(files, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 8 {
		t.Fatalf("found only %v", files)
	}
	return files
}

type docLink struct {
	line   int
	target string
}

// links returns the link targets of doc outside fenced code.
func links(t *testing.T, doc string, re *regexp.Regexp) []docLink {
	b, err := os.ReadFile(filepath.Join(root, doc))
	if err != nil {
		t.Fatal(err)
	}
	var out []docLink
	fence := false
	for i, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			fence = !fence
			continue
		}
		if fence {
			continue
		}
		for _, m := range re.FindAllStringSubmatch(l, -1) {
			out = append(out, docLink{i + 1, m[1]})
		}
	}
	return out
}

// anchors returns the heading anchors of a Markdown file.
func anchors(t *testing.T, path string) map[string]bool {
	b, err := os.ReadFile(filepath.Join(root, path))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	out, seen := map[string]bool{}, map[string]int{}
	fence := false
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			fence = !fence
		}
		if fence || !strings.HasPrefix(l, "#") {
			continue
		}
		s := headingSlug(strings.TrimLeft(l, "# "))
		if n := seen[s]; n > 0 {
			out[fmt.Sprintf("%s-%d", s, n)] = true
		} else {
			out[s] = true
		}
		seen[s]++
	}
	return out
}

// headingSlug is GitHub's anchor of a heading: lower case, letters, digits,
// '-' and '_' kept, spaces made '-', everything else dropped.
func headingSlug(h string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(h)) {
		switch {
		case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteByte('-')
		}
	}
	return b.String()
}

// configReference turns the "# YAML schema" and "# Policy Agent statements"
// sections of the config package's doc comment into Markdown: headings become
// ## headings (under the document's # title) and indented blocks fenced code.
func configReference(src string) string {
	var lines []string
	in := false
	for _, l := range strings.Split(src, "\n") {
		if !strings.HasPrefix(l, "//") {
			if in {
				break
			}
			continue
		}
		l = strings.TrimPrefix(l, "//")
		l = strings.TrimPrefix(l, " ")
		if strings.HasPrefix(l, "# ") {
			h := strings.TrimPrefix(l, "# ")
			if h == "YAML schema" || h == "Policy Agent statements" {
				in = true
			} else if in {
				break
			}
		}
		if in {
			lines = append(lines, l)
		}
	}
	var b strings.Builder
	code := false
	for i, l := range lines {
		isCode := strings.HasPrefix(l, "\t")
		if l == "" && code {
			// A blank line inside a code block stays in it when code follows.
			if i+1 < len(lines) && strings.HasPrefix(lines[i+1], "\t") {
				b.WriteString("\n")
				continue
			}
		}
		if isCode && !code {
			b.WriteString("```\n")
			code = true
		} else if !isCode && code {
			b.WriteString("```\n")
			code = false
		}
		switch {
		case isCode:
			b.WriteString(strings.TrimPrefix(l, "\t") + "\n")
		case strings.HasPrefix(l, "# "):
			b.WriteString("## " + strings.TrimPrefix(l, "# ") + "\n")
		default:
			b.WriteString(l + "\n")
		}
	}
	if code {
		b.WriteString("```\n")
	}
	return b.String()
}

func metricsTable() string {
	var b strings.Builder
	b.WriteString("| metric | type | labels | what |\n|---|---|---|---|\n")
	for _, m := range metrics.Defs {
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", m.Name, m.Type, strings.Join(m.Labels, ", "), m.Help)
	}
	return b.String()
}
