package config

import (
	"fmt"
	"math"
	"net/netip"
	"strings"
	"time"
	"unicode/utf8"

	"weir/policy"
)

// The Policy Agent statement syntax (z/OS Communications Server pagent.conf):
//
//	# comment to the end of the line
//	Statement [arguments...]
//	{
//	  Attribute value [value...]   # one per line
//	}
//
// Keywords are case-insensitive; names (of actions and rules) are not. A
// block may open on the statement's line or on a later one, and blocks may
// nest (weir's statements use one level).

// paStatements maps each statement keyword, lower case, to its canonical
// spelling.
var paStatements = map[string]string{
	"policyperfmonitorforsdr": "PolicyPerfMonitorForSDR",
	"policyaction":            "PolicyAction",
	"policyrule":              "PolicyRule",
}

// paUnsupported are Policy Agent attributes weir recognises but does not
// implement; naming one is an error that says so, rather than "unknown".
var paUnsupported = map[string]string{
	"maxrate":             "MaxRate",
	"maxdelay":            "MaxDelay",
	"maxratelimit":        "MaxRateLimit",
	"policyscope":         "PolicyScope",
	"priority":            "Priority",
	"policyrulepriority":  "PolicyRulePriority",
	"permission":          "Permission",
	"routingtos":          "RoutingTOS",
	"tokenbucketsize":     "TokenBucketSize",
	"flowservicetype":     "FlowServiceType",
	"policytimecondition": "PolicyTimeCondition",
	"inboundinterface":    "InboundInterface",
	"outboundinterface":   "OutboundInterface",
}

// maxNesting bounds block depth so hostile input cannot exhaust the stack.
const maxNesting = 16

type tokKind uint8

const (
	tWord tokKind = iota
	tOpen
	tClose
	tNewline
	tEOF
)

type token struct {
	kind      tokKind
	text      string
	line, col int
}

// lexPA splits data into words, braces and line ends; comments are dropped.
// Columns count characters (UTF-8 sequences), as the YAML parser's do.
func lexPA(data []byte) []token {
	var toks []token
	line, col := 1, 1
	for i := 0; i < len(data); {
		c := data[i]
		switch {
		case c == '\n':
			toks = append(toks, token{tNewline, "", line, col})
			i++
			line, col = line+1, 1
			continue
		case c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v':
		case c == '#':
			for i < len(data) && data[i] != '\n' {
				i++
			}
			continue
		case c == '{':
			toks = append(toks, token{tOpen, "{", line, col})
		case c == '}':
			toks = append(toks, token{tClose, "}", line, col})
		default:
			j := i
			for j < len(data) && !strings.ContainsRune(" \t\r\f\v\n#{}", rune(data[j])) {
				j++
			}
			toks = append(toks, token{tWord, string(data[i:j]), line, col})
			col += utf8.RuneCount(data[i:j])
			i = j
			continue
		}
		i++
		col++
	}
	return append(toks, token{tEOF, "", line, col})
}

// stmt is one statement or attribute, with its block if it has one.
type stmt struct {
	key      token
	args     []token
	hasBlock bool
	block    []*stmt
}

type paParser struct {
	b    *builder
	file string
	toks []token
	i    int
}

func (p *paParser) pos(t token) Pos { return Pos{File: p.file, Line: t.line, Col: t.col} }

func (p *paParser) errf(t token, format string, args ...any) {
	p.b.e.add(p.pos(t), format, args...)
}

// block parses statements up to the `}` matching open (or to the end of the
// input at the top, where open is nil).
func (p *paParser) block(depth int, open *token) []*stmt {
	var out []*stmt
	for {
		t := p.toks[p.i]
		switch t.kind {
		case tNewline:
			p.i++
		case tEOF:
			if open != nil {
				p.errf(*open, "unclosed { (no matching })")
			}
			return out
		case tClose:
			p.i++
			if open != nil {
				return out
			}
			p.errf(t, "} without a matching {")
		case tOpen:
			p.i++
			p.errf(t, "{ must follow a statement")
			p.nested(depth, t)
		case tWord:
			s := &stmt{key: t}
			p.i++
			for p.toks[p.i].kind == tWord {
				s.args = append(s.args, p.toks[p.i])
				p.i++
			}
			j := p.i
			for p.toks[j].kind == tNewline {
				j++
			}
			if p.toks[j].kind == tOpen {
				p.i = j + 1
				s.hasBlock = true
				s.block = p.nested(depth, p.toks[j])
			}
			out = append(out, s)
		}
	}
}

// nested parses the block opened by open, or skips it when too deep.
func (p *paParser) nested(depth int, open token) []*stmt {
	if depth < maxNesting {
		return p.block(depth+1, &open)
	}
	p.errf(open, "blocks nested more than %d deep", maxNesting)
	for n := 1; n > 0; p.i++ {
		switch p.toks[p.i].kind {
		case tOpen:
			n++
		case tClose:
			n--
		case tEOF:
			p.errf(open, "unclosed { (no matching })")
			return nil
		}
	}
	return nil
}

// attr is one attribute a statement accepts; fn gets the attribute.
type attr struct {
	name string // canonical spelling
	fn   func(a *stmt)
}

// attrs dispatches the attributes in s's block, case-insensitively.
func (p *paParser) attrs(s *stmt, what string, spec []attr) {
	seen := map[string]token{}
	for _, a := range s.block {
		key := strings.ToLower(a.key.text)
		var at *attr
		for i := range spec {
			if strings.ToLower(spec[i].name) == key {
				at = &spec[i]
			}
		}
		switch {
		case at != nil:
			if first, ok := seen[key]; ok {
				p.errf(a.key, "duplicate %s in %s (first at line %d)", at.name, what, first.line)
				continue
			}
			seen[key] = a.key
			if a.hasBlock {
				p.errf(a.key, "%s takes values, not a block", at.name)
				continue
			}
			at.fn(a)
		case paUnsupported[key] != "":
			p.errf(a.key, "%s is a Policy Agent attribute weir does not implement", paUnsupported[key])
		default:
			names := make([]string, len(spec))
			for i := range spec {
				names[i] = spec[i].name
			}
			p.errf(a.key, "unknown attribute %q in %s%s", a.key.text, what, suggest(a.key.text, names))
		}
	}
}

// nargs checks that a has lo..hi values.
func (p *paParser) nargs(a *stmt, lo, hi int) bool {
	n := len(a.args)
	if n >= lo && n <= hi {
		return true
	}
	want := fmt.Sprintf("%d", lo)
	switch {
	case hi == lo+1:
		want = fmt.Sprintf("%d or %d", lo, hi)
	case hi > lo:
		want = fmt.Sprintf("%d to %d", lo, hi)
	}
	vals := "values"
	if hi == 1 {
		vals = "value"
	}
	p.errf(a.key, "%s: want %s %s, got %d", a.key.text, want, vals, n)
	return false
}

// int parses value i of a in lo..hi.
func (p *paParser) int(a *stmt, i int, lo, hi int64) (int64, bool) {
	t := a.args[i]
	v, err := parseInt(t.text, lo, hi)
	if err != nil {
		p.errf(t, "%s: %v", a.key.text, err)
		return 0, false
	}
	return v, true
}

func (p *paParser) top(stmts []*stmt) {
	for _, s := range stmts {
		switch strings.ToLower(s.key.text) {
		case "policyperfmonitorforsdr":
			p.monitor(s)
		case "policyaction":
			p.action(s)
		case "policyrule":
			p.rule(s)
		default:
			p.errf(s.key, "unknown statement %q (want PolicyPerfMonitorForSDR, PolicyAction or PolicyRule)%s",
				s.key.text, suggest(s.key.text, []string{"PolicyPerfMonitorForSDR", "PolicyAction", "PolicyRule"}))
		}
	}
}

func (p *paParser) monitor(s *stmt) {
	m := &p.b.cfg.Monitor
	if !p.nargs(s, 0, 1) || !p.b.setMonitor(p.pos(s.key)) {
		return
	}
	m.Enabled = true
	if len(s.args) == 1 {
		switch strings.ToLower(s.args[0].text) {
		case "enable":
		case "disable":
			m.Enabled = false
		default:
			p.errf(s.args[0], "PolicyPerfMonitorForSDR: want enable or disable, got %q", s.args[0].text)
		}
	}
	pair := func(a *stmt, t, f *int) {
		if !p.nargs(a, 2, 2) {
			return
		}
		x, ok1 := p.int(a, 0, 1, maxRatio)
		y, ok2 := p.int(a, 1, 1, maxFraction)
		if ok1 && ok2 {
			*t, *f = int(x), int(y)
		}
	}
	frac := func(a *stmt, f *int) {
		if p.nargs(a, 1, 1) {
			x, _ := p.int(a, 0, 1, maxFraction)
			*f = int(x)
		}
	}
	p.attrs(s, "PolicyPerfMonitorForSDR", []attr{
		{"SamplingInterval", func(a *stmt) {
			if p.nargs(a, 1, 1) {
				x, _ := p.int(a, 0, 1, 86400)
				m.SamplingInterval = time.Duration(x) * time.Second
			}
		}},
		{"LossRatioAndWeightFr", func(a *stmt) { pair(a, &m.LossThreshold, &m.LossStep) }},
		{"TimeoutRatioAndWeightFr", func(a *stmt) { pair(a, &m.TimeoutThreshold, &m.TimeoutStep) }},
		{"LossMaxWeightFr", func(a *stmt) { frac(a, &m.LossMax) }},
		{"TimeoutMaxWeightFr", func(a *stmt) { frac(a, &m.TimeoutMax) }},
		{"MaxConnWeightFr", func(a *stmt) {
			if !p.nargs(a, 3, 3) {
				return
			}
			var x [3]int
			for i := range x {
				v, ok := p.int(a, i, 1, maxFraction)
				if !ok {
					return
				}
				x[i] = int(v)
			}
			if x[0] >= x[1] || x[1] >= x[2] {
				p.errf(a.args[0], "%s: levels %d %d %d must ascend", a.key.text, x[0], x[1], x[2])
				return
			}
			m.MaxConnLevels = x
		}},
	})
}

func (p *paParser) action(s *stmt) {
	if !p.nargs(s, 1, 1) {
		return
	}
	a := &policy.Action{Name: s.args[0].text}
	p.attrs(s, "PolicyAction "+a.Name, []attr{
		{"OutgoingTOS", func(at *stmt) {
			if p.nargs(at, 1, 1) {
				tos, err := parseTOS(at.args[0].text)
				if err != nil {
					p.errf(at.args[0], "%s: %v", at.key.text, err)
					return
				}
				a.OutgoingTOS, a.SetTOS = tos, true
			}
		}},
		{"MinRate", func(at *stmt) {
			if p.nargs(at, 1, 1) {
				a.MinRate, _ = p.int(at, 0, 0, math.MaxInt64)
			}
		}},
		{"MeanRate", func(at *stmt) {
			if p.nargs(at, 1, 1) {
				a.MeanRate, _ = p.int(at, 0, 0, math.MaxInt64)
			}
		}},
		{"MaxConnections", func(at *stmt) {
			if p.nargs(at, 1, 1) {
				a.MaxConnections, _ = p.int(at, 0, -1, math.MaxInt64)
			}
		}},
	})
	p.b.addAction(&actionDef{a: a, at: p.pos(s.args[0])})
}

func (p *paParser) rule(s *stmt) {
	if !p.nargs(s, 1, 1) {
		return
	}
	r := &policy.Rule{Name: s.args[0].text}
	d := &ruleDef{r: r}
	ports := func(a *stmt, pr *policy.PortRange) {
		if !p.nargs(a, 1, 2) {
			return
		}
		text := a.args[0].text
		if len(a.args) == 2 {
			text += "-" + a.args[1].text
		}
		v, err := parsePortRange(text)
		if err != nil {
			p.errf(a.args[0], "%s: %v", a.key.text, err)
			return
		}
		*pr = v
	}
	addrs := func(a *stmt, pf *netip.Prefix) {
		if !p.nargs(a, 1, 2) {
			return
		}
		if len(a.args) == 1 {
			v, err := parsePrefix(a.args[0].text)
			if err != nil {
				p.errf(a.args[0], "%s: %v", a.key.text, err)
				return
			}
			*pf = v
			return
		}
		var ends [2]netip.Addr
		for i := range ends {
			v, err := netip.ParseAddr(a.args[i].text)
			if err != nil || v.Zone() != "" {
				p.errf(a.args[i], "%s: want an address, got %q", a.key.text, a.args[i].text)
				return
			}
			ends[i] = v
		}
		v, err := rangePrefix(ends[0], ends[1])
		if err != nil {
			p.errf(a.args[0], "%s: %v", a.key.text, err)
			return
		}
		*pf = v
	}
	p.attrs(s, "PolicyRule "+r.Name, []attr{
		{"ProtocolNumberRange", func(a *stmt) {
			if !p.nargs(a, 1, 2) {
				return
			}
			text := a.args[0].text
			if len(a.args) == 2 {
				text += "-" + a.args[1].text
			}
			lo, hi, err := parseProtoRange(text)
			if err != nil {
				p.errf(a.args[0], "%s: %v", a.key.text, err)
				return
			}
			r.ProtoLo, r.ProtoHi = lo, hi
		}},
		{"SourcePortRange", func(a *stmt) { ports(a, &r.SrcPort) }},
		{"DestinationPortRange", func(a *stmt) { ports(a, &r.DstPort) }},
		{"SourceAddressRange", func(a *stmt) { addrs(a, &r.Src) }},
		{"DestinationAddressRange", func(a *stmt) { addrs(a, &r.Dst) }},
		{"PolicyActionReference", func(a *stmt) {
			if p.nargs(a, 1, 1) {
				d.action, d.actionAt = a.args[0].text, p.pos(a.args[0])
			}
		}},
	})
	if d.action == "" {
		p.errf(s.key, "PolicyRule %s has no PolicyActionReference", r.Name)
		return
	}
	p.b.addRule(d, p.pos(s.args[0]))
}

// parsePA parses Policy Agent statements from one file into b.
func parsePA(b *builder, name string, data []byte) {
	b.e.file(name)
	p := &paParser{b: b, file: name, toks: lexPA(data)}
	p.top(p.block(0, nil))
}

// ParsePolicyAgent parses a file of z/OS Policy Agent statements
// (PolicyPerfMonitorForSDR, PolicyAction, PolicyRule) into a config with no
// services. Errors are an ErrorList.
func ParsePolicyAgent(name string, data []byte) (*policy.Config, error) {
	b := newBuilder()
	parsePA(b, name, data)
	return b.finish(name)
}
