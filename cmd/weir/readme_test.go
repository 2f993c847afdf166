package main

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"

	"weir/cmd/weir/internal/metrics"
)

var update = flag.Bool("update", false, "rewrite the generated sections of README.md")

// TestREADMEGenerated keeps README.md's configuration reference identical to
// the parser's documentation (policy/config/doc.go) and its metrics table
// identical to the metric definitions (internal/metrics.Defs). Run `go test ./cmd/weir -run
// README -update` after changing either.
func TestREADMEGenerated(t *testing.T) {
	const path = "../../README.md"
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	doc, err := os.ReadFile("../../policy/config/doc.go")
	if err != nil {
		t.Fatal(err)
	}
	sections := map[string]string{
		"config-reference": configReference(string(doc)),
		"metrics":          metricsTable(),
	}
	for name, want := range sections {
		begin, end := "<!-- "+name+":begin -->\n", "<!-- "+name+":end -->"
		i, j := strings.Index(readme, begin), strings.Index(readme, end)
		if i < 0 || j < i {
			t.Fatalf("README.md has no %s markers", name)
		}
		got := readme[i+len(begin) : j]
		if got == want {
			continue
		}
		if *update {
			readme = readme[:i+len(begin)] + want + readme[j:]
			continue
		}
		t.Errorf("README.md section %s is out of date: run go test ./cmd/weir -run README -update", name)
	}
	if *update {
		if err := os.WriteFile(path, []byte(readme), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// configReference turns the "# YAML schema" and "# Policy Agent statements"
// sections of the config package's doc comment into Markdown: headings become
// ### headings and indented blocks fenced code.
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
			b.WriteString("### " + strings.TrimPrefix(l, "# ") + "\n")
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
