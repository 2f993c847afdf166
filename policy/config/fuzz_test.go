package config

import (
	"errors"
	"strings"
	"testing"
)

// fuzzFiles serves the seed block for every include, so the fuzzer also
// drives the Policy Agent parser through the YAML include path.
var fuzzFiles = Parser{ReadFile: func(name string) ([]byte, error) {
	if strings.HasSuffix(name, ".pa") {
		return []byte(seedBlock), nil
	}
	return nil, errors.New("no such file")
}}

// checkResult asserts what every parse must give: a compiled config or a
// list of one-line, positioned errors, the same on every run.
func checkResult(t *testing.T, parse func() (string, error)) {
	first, err := parse()
	if err != nil {
		var list ErrorList
		if !errors.As(err, &list) {
			t.Fatalf("error is %T, not an ErrorList: %v", err, err)
		}
		for _, e := range list {
			if e.Line < 0 || e.Col < 0 || e.Msg == "" || strings.Contains(e.Msg, "\n") {
				t.Fatalf("malformed error %q", e.Error())
			}
		}
	}
	again, err2 := parse()
	if again != first || (err == nil) != (err2 == nil) || (err != nil && err.Error() != err2.Error()) {
		t.Fatalf("two parses of one input differ:\n%v\n%v", err, err2)
	}
}

func FuzzParseYAML(f *testing.F) {
	f.Add([]byte("include: [zos.pa]\nservices:\n  - {name: a, vips: [198.18.0.1], port: 80, targets: [{address: 198.18.1.1:80}]}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		checkResult(t, func() (string, error) {
			c, err := fuzzFiles.ParseYAML("f.yaml", data)
			if err != nil {
				return "", err
			}
			return c.Instance.Name, nil
		})
	})
}

func FuzzParsePolicyAgent(f *testing.F) {
	f.Add([]byte(seedBlock))
	f.Fuzz(func(t *testing.T, data []byte) {
		checkResult(t, func() (string, error) {
			c, err := ParsePolicyAgent("f.pa", data)
			if err != nil {
				return "", err
			}
			if len(c.Services) != 0 {
				t.Fatalf("a Policy Agent file defined services")
			}
			return c.Instance.Name, nil
		})
	})
}
