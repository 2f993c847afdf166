package config

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"weir/policy"
)

// MaxFileSize is the largest config file read from disk (16 MiB).
const MaxFileSize = 16 << 20

// Parser reads config files. Its zero value reads them from the file system;
// tests and fuzzers set ReadFile to keep the parsers off the disk.
type Parser struct {
	// ReadFile reads a file named to Load or by a YAML `include`. Nil means
	// the file system: regular files up to MaxFileSize bytes.
	ReadFile func(name string) ([]byte, error)
}

// Load reads the config file at path and parses it as YAML or as Policy
// Agent statements (see Format). Parse errors are an ErrorList.
func Load(path string) (*policy.Config, error) { return Parser{}.Load(path) }

// Load is the package-level Load with p's file access.
func (p Parser) Load(path string) (*policy.Config, error) {
	data, err := p.read(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	return p.Parse(path, data)
}

// Parse parses data, named name, in the format Format picks.
func (p Parser) Parse(name string, data []byte) (*policy.Config, error) {
	if Format(name, data) == FormatPolicyAgent {
		return ParsePolicyAgent(name, data)
	}
	return p.ParseYAML(name, data)
}

// The config file formats.
const (
	FormatYAML        = "yaml"
	FormatPolicyAgent = "policy-agent"
)

// Format says how a file is parsed: by its extension (.yaml and .yml are
// YAML; .pa, .policy and .conf are Policy Agent statements), otherwise by its
// first word: a Policy Agent statement keyword (PolicyAction, PolicyRule,
// PolicyPerfMonitorForSDR, any case) makes it Policy Agent, anything else
// YAML.
func Format(name string, data []byte) string {
	switch strings.ToLower(filepath.Ext(name)) {
	case ".yaml", ".yml":
		return FormatYAML
	case ".pa", ".policy", ".conf":
		return FormatPolicyAgent
	}
	for _, line := range strings.Split(string(data[:min(len(data), 1<<16)]), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' {
			continue
		}
		words := strings.FieldsFunc(line, func(r rune) bool {
			return r == ' ' || r == '\t' || r == '\r' || r == '{' || r == '#'
		})
		if len(words) > 0 {
			if _, ok := paStatements[strings.ToLower(words[0])]; ok {
				return FormatPolicyAgent
			}
		}
		break
	}
	return FormatYAML
}

func (p Parser) read(name string) ([]byte, error) {
	if p.ReadFile != nil {
		return p.ReadFile(name)
	}
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", name)
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxFileSize+1))
	if err != nil {
		return nil, err
	}
	if len(data) > MaxFileSize {
		return nil, fmt.Errorf("%s is larger than %d bytes", name, MaxFileSize)
	}
	return data, nil
}

// pathErr drops the operation and path from a file-system error, for
// messages that already name the file.
func pathErr(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
