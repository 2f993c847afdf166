package config

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"net"
	"net/url"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"weir/policy"
)

// nodeBudget bounds the YAML nodes one parse visits, aliases expanded, so
// that anchors referenced many times cannot make a small file expensive.
const nodeBudget = 1 << 20

// yparser walks one YAML document into a builder.
type yparser struct {
	b        *builder
	file     string
	budget   int
	overDone bool
}

func (p *yparser) pos(n *yaml.Node) Pos { return Pos{File: p.file, Line: n.Line, Col: n.Column} }

// at is the position of the node n stands for, following aliases without
// charging the budget (n has been visited already); nil gives line 0.
func (p *yparser) at(n *yaml.Node) Pos {
	for n != nil && n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	if n == nil {
		return Pos{File: p.file}
	}
	return p.pos(n)
}

func (p *yparser) errf(n *yaml.Node, format string, args ...any) {
	p.b.e.add(p.pos(n), format, args...)
}

// deref follows aliases and charges the node budget; nil means stop.
func (p *yparser) deref(n *yaml.Node) *yaml.Node {
	for n != nil && n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	if n == nil {
		return nil
	}
	p.budget--
	if p.budget < 0 {
		if !p.overDone {
			p.overDone = true
			p.b.e.force(p.pos(n), "document too large once aliases are expanded (over %d nodes)", nodeBudget)
		}
		return nil
	}
	return n
}

// describe names a node's kind and value for a wrong-type error.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		if n.ShortTag() == "!!null" {
			return "nothing"
		}
		v := n.Value
		if len(v) > 40 {
			v = v[:40] + "…"
		}
		return strconv.Quote(v)
	}
	return "something else"
}

func isNull(n *yaml.Node) bool { return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" }

// isEmpty reports whether n is null or an empty list.
func isEmpty(n *yaml.Node) bool {
	return isNull(n) || n.Kind == yaml.SequenceNode && len(n.Content) == 0
}

// field is one key of a mapping: its handler gets the key and value nodes.
type field struct {
	name     string
	required bool
	fn       func(k, v *yaml.Node)
}

// mapping checks that n is a mapping of known, unique keys and calls each
// field's handler. what names the mapping in errors. A null value counts as
// an empty mapping.
func (p *yparser) mapping(n *yaml.Node, what string, fields []field) {
	if n = p.deref(n); n == nil {
		return
	}
	if isNull(n) {
		n = &yaml.Node{Kind: yaml.MappingNode, Line: n.Line, Column: n.Column}
	}
	if n.Kind != yaml.MappingNode {
		p.errf(n, "%s: want a mapping, got %s", what, describe(n))
		return
	}
	seen := map[string]*yaml.Node{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := p.deref(n.Content[i]), n.Content[i+1]
		if k == nil {
			return
		}
		if k.Kind != yaml.ScalarNode {
			p.errf(k, "%s: keys must be plain words, got %s", what, describe(k))
			continue
		}
		if first, ok := seen[k.Value]; ok {
			p.errf(k, "duplicate key %q in %s (first at line %d)", k.Value, what, first.Line)
			continue
		}
		seen[k.Value] = k
		var f *field
		for j := range fields {
			if fields[j].name == k.Value {
				f = &fields[j]
				break
			}
		}
		if f == nil {
			names := make([]string, len(fields))
			for j := range fields {
				names[j] = fields[j].name
			}
			p.errf(k, "unknown key %q in %s%s", k.Value, what, suggest(k.Value, names))
			continue
		}
		f.fn(k, v)
	}
	for _, f := range fields {
		if f.required && seen[f.name] == nil {
			p.errf(n, "%s: missing %q", what, f.name)
		}
	}
}

// seq calls fn for each item of a list; a null value is an empty list.
func (p *yparser) seq(k, v *yaml.Node, fn func(item *yaml.Node)) {
	if v = p.deref(v); v == nil || isNull(v) {
		return
	}
	if v.Kind != yaml.SequenceNode {
		p.errf(v, "%s: want a list, got %s", k.Value, describe(v))
		return
	}
	for _, item := range v.Content {
		fn(item)
	}
}

// scalar returns v's text if it is a non-null scalar.
func (p *yparser) scalar(k, v *yaml.Node, want string) (*yaml.Node, bool) {
	if v = p.deref(v); v == nil {
		return nil, false
	}
	if v.Kind != yaml.ScalarNode || isNull(v) {
		p.errf(v, "%s: want %s, got %s", k.Value, want, describe(v))
		return nil, false
	}
	return v, true
}

func (p *yparser) str(k, v *yaml.Node) (string, bool) {
	n, ok := p.scalar(k, v, "a string")
	if !ok {
		return "", false
	}
	if n.Value == "" {
		p.errf(n, "%s: must not be empty", k.Value)
		return "", false
	}
	return n.Value, true
}

func (p *yparser) int(k, v *yaml.Node, lo, hi int64) (int64, bool) {
	n, ok := p.scalar(k, v, "an integer")
	if !ok {
		return 0, false
	}
	var x int64
	if n.ShortTag() != "!!int" {
		p.errf(n, "%s: want an integer, got %s", k.Value, describe(n))
		return 0, false
	}
	if err := n.Decode(&x); err != nil {
		p.errf(n, "%s: %s is out of range %d..%d", k.Value, n.Value, lo, hi)
		return 0, false
	}
	if x < lo || x > hi {
		p.errf(n, "%s: %s is out of range %d..%d", k.Value, n.Value, lo, hi)
		return 0, false
	}
	return x, true
}

func (p *yparser) bool(k, v *yaml.Node) (bool, bool) {
	n, ok := p.scalar(k, v, "true or false")
	if !ok {
		return false, false
	}
	var b bool
	if n.ShortTag() != "!!bool" || n.Decode(&b) != nil {
		p.errf(n, "%s: want true or false, got %s", k.Value, describe(n))
		return false, false
	}
	return b, true
}

// parse applies fn to a scalar's text and reports its error at the value.
// parseOnOff parses on or off (true or false) and reports off.
func parseOnOff(s string) (bool, error) {
	switch s {
	case "on", "true":
		return false, nil
	case "off", "false":
		return true, nil
	}
	return false, fmt.Errorf("%q: want on or off", s)
}

func parse[T any](p *yparser, k, v *yaml.Node, want string, fn func(string) (T, error)) (T, bool) {
	var zero T
	n, ok := p.scalar(k, v, want)
	if !ok {
		return zero, false
	}
	x, err := fn(n.Value)
	if err != nil {
		p.errf(n, "%s: %v", k.Value, err)
		return zero, false
	}
	return x, true
}

// positive parses a duration that must be > 0.
func (p *yparser) positive(k, v *yaml.Node) (time.Duration, bool) {
	d, ok := parse(p, k, v, "a duration", parseDuration)
	if ok && d == 0 {
		p.errf(p.deref(v), "%s: must be more than 0", k.Value)
		return 0, false
	}
	return d, ok
}

// ints parses a list of exactly n integers in lo..hi.
func (p *yparser) ints(k, v *yaml.Node, n int, lo, hi int64) ([]int64, bool) {
	l := p.deref(v)
	if l == nil {
		return nil, false
	}
	if l.Kind != yaml.SequenceNode || len(l.Content) != n {
		p.errf(l, "%s: want a list of %d integers, got %s", k.Value, n, describeLen(l))
		return nil, false
	}
	out := make([]int64, n)
	for i, item := range l.Content {
		x, ok := p.int(k, item, lo, hi)
		if !ok {
			return nil, false
		}
		out[i] = x
	}
	return out, true
}

func describeLen(n *yaml.Node) string {
	if n.Kind == yaml.SequenceNode {
		return fmt.Sprintf("a list of %d", len(n.Content))
	}
	return describe(n)
}

// yamlLine extracts the line from a yaml library error ("yaml: line 3: …").
var yamlLine = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// parseYAML decodes one file into b and returns the includes it names.
func (p *yparser) parseYAML(data []byte) (includes []include) {
	var doc yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	err := safeDecode(dec, &doc)
	if err == io.EOF {
		return nil // an empty file is an empty config
	}
	if err != nil {
		p.yamlErr(err)
		return nil
	}
	var extra yaml.Node
	if err := safeDecode(dec, &extra); err != io.EOF {
		if err != nil {
			p.yamlErr(err)
		} else {
			p.errf(&extra, "a config file holds one YAML document; this is a second one")
		}
		return nil
	}
	root := &doc
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = root.Content[0]
	}
	return p.top(root)
}

// safeDecode turns a panic inside the YAML library into an error, so that a
// malformed file can never take the appliance down on reload.
func safeDecode(dec *yaml.Decoder, n *yaml.Node) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("yaml: the YAML parser failed: %v", r)
		}
	}()
	return dec.Decode(n)
}

func (p *yparser) yamlErr(err error) {
	msg := err.Error()
	line := 1
	if m := yamlLine.FindStringSubmatch(msg); m != nil {
		line, _ = strconv.Atoi(m[1])
		msg = m[2]
	} else {
		msg = strings.TrimPrefix(msg, "yaml: ")
	}
	msg = strings.ReplaceAll(msg, "\n", " ")
	p.b.e.add(Pos{File: p.file, Line: line, Col: 1}, "YAML syntax: %s", msg)
}

// include is a Policy Agent file named by the YAML `include` key.
type include struct {
	path string
	at   Pos
}

func (p *yparser) top(root *yaml.Node) (includes []include) {
	c := &p.b.cfg
	var noServicesAt *yaml.Node
	defer func() {
		if c.NoServices && len(c.Services) > 0 {
			p.errf(noServicesAt, "noServices: true, but the file defines %d services: remove the key or the services", len(c.Services))
		}
	}()
	p.mapping(root, "config", []field{
		{name: "instance", fn: func(_, v *yaml.Node) { p.instance(v) }},
		{name: "classes", fn: func(k, v *yaml.Node) { p.seq(k, v, p.class) }},
		{name: "services", fn: func(k, v *yaml.Node) { p.seq(k, v, p.service) }},
		{name: "actions", fn: func(k, v *yaml.Node) { p.seq(k, v, p.action) }},
		{name: "rules", fn: func(k, v *yaml.Node) { p.seq(k, v, p.rule) }},
		{name: "monitor", fn: func(k, v *yaml.Node) {
			if p.b.setMonitor(p.pos(k)) {
				p.monitor(&c.Monitor, v)
			}
		}},
		{name: "balancer", fn: func(_, v *yaml.Node) { p.balancer(&c.Balancer, v) }},
		{name: "cluster", fn: func(_, v *yaml.Node) { c.Cluster = p.cluster(v) }},
		{name: "noServices", fn: func(k, v *yaml.Node) { c.NoServices, _ = p.bool(k, v); noServicesAt = k }},
		{name: "include", fn: func(k, v *yaml.Node) {
			one := func(item *yaml.Node) {
				if s, ok := p.str(k, item); ok {
					includes = append(includes, include{s, p.at(item)})
				}
			}
			if n := p.deref(v); n != nil && n.Kind == yaml.ScalarNode && !isNull(n) {
				one(n)
				return
			}
			p.seq(k, v, one)
		}},
	})
	return includes
}

func (p *yparser) limits(l *policy.Limits, v *yaml.Node) {
	var burstAt *yaml.Node
	p.mapping(v, "limits", append(p.limitFields(l, &burstAt), field{name: "burstBytes", fn: func(k, v *yaml.Node) {
		l.BurstBytes, _ = parse(p, k, v, "a byte count", ParseBytes)
		burstAt = k
	}}))
	if burstAt != nil && l.BurstBytes > 0 && l.MaxBandwidth == 0 {
		p.errf(burstAt, "burstBytes needs maxBandwidth (the bucket refills at that rate)")
	}
}

// limitFields are the keys LIMITS and CLIENTLIMITS share.
func (p *yparser) limitFields(l *policy.Limits, _ **yaml.Node) []field {
	return []field{
		{name: "maxBandwidth", fn: func(k, v *yaml.Node) { l.MaxBandwidth, _ = parse(p, k, v, "bytes per second", ParseBytes) }},
		{name: "enforceBandwidth", fn: func(k, v *yaml.Node) { l.EnforceBandwidth, _ = p.bool(k, v) }},
		{name: "maxConnections", fn: func(k, v *yaml.Node) { l.MaxConnections, _ = p.int(k, v, -1, math.MaxInt64) }},
		{name: "enforceConnections", fn: func(k, v *yaml.Node) { l.EnforceConnections, _ = p.bool(k, v) }},
		{name: "queue", fn: func(k, v *yaml.Node) { l.Queue, _ = p.int(k, v, 0, policy.MaxQueue) }},
		{name: "queueTimeout", fn: func(k, v *yaml.Node) {
			if d, ok := p.positive(k, v); ok {
				l.QueueTimeout = d
			}
		}},
	}
}

// clientLimits parses a clientLimits mapping: LIMITS' keys (burstBytes
// aside) plus the grouping and the table's bound.
func (p *yparser) clientLimits(c *policy.ClientLimits, v *yaml.Node) {
	fs := append(p.limitFields(&c.Limits, nil),
		field{name: "clientPrefix", fn: func(k, v *yaml.Node) {
			p.mapping(v, "clientPrefix", []field{
				{name: "ipv4", fn: func(k, v *yaml.Node) { n, _ := p.int(k, v, 1, 32); c.PrefixV4 = int(n) }},
				{name: "ipv6", fn: func(k, v *yaml.Node) { n, _ := p.int(k, v, 1, 128); c.PrefixV6 = int(n) }},
			})
		}},
		field{name: "tableSize", fn: func(k, v *yaml.Node) {
			n, _ := p.int(k, v, 1, policy.MaxClientTableSize)
			c.TableSize = int(n)
		}})
	p.mapping(v, "clientLimits", fs)
}

// httpOptions parses a service's http mapping; defaults and range checks
// are policy.Compile's.
func (p *yparser) httpOptions(o *policy.HTTPOptions, v *yaml.Node) {
	dur := func(dst *time.Duration) func(k, v *yaml.Node) {
		return func(k, v *yaml.Node) {
			if d, ok := p.positive(k, v); ok {
				*dst = d
			}
		}
	}
	p.mapping(v, "http", []field{
		{name: "headerTimeout", fn: dur(&o.HeaderTimeout)},
		{name: "maxHeaderBytes", fn: func(k, v *yaml.Node) {
			n, _ := parse(p, k, v, "a size in bytes", ParseBytes)
			if n < 256 || n > 1<<20 {
				p.errf(v, "maxHeaderBytes: %d is out of range 256..1MiB", n)
				return
			}
			o.MaxHeaderBytes = int(n)
		}},
		{name: "keepAliveIdle", fn: dur(&o.KeepAliveIdle)},
		{name: "maxClients", fn: func(k, v *yaml.Node) { o.MaxClients, _ = p.int(k, v, 1, 1<<40) }},
		{name: "backendIdle", fn: dur(&o.BackendIdle)},
		{name: "maxIdlePerTarget", fn: func(k, v *yaml.Node) {
			n, _ := p.int(k, v, 1, 1<<20)
			o.MaxIdlePerTarget = int(n)
		}},
		{name: "forwarded", fn: func(k, v *yaml.Node) { o.Forwarded, _ = parse(p, k, v, "a forwarded mode", policy.ParseForwarded) }},
	})
}

// udpOptions parses a service's udp mapping; defaults are policy.Compile's.
func (p *yparser) udpOptions(o *policy.UDPOptions, v *yaml.Node) {
	p.mapping(v, "udp", []field{
		{name: "idleTimeout", fn: func(k, v *yaml.Node) {
			if d, ok := p.positive(k, v); ok {
				o.IdleTimeout = d
			}
		}},
		{name: "responseTimeout", fn: func(k, v *yaml.Node) {
			if d, ok := p.positive(k, v); ok {
				o.ResponseTimeout = d
			}
		}},
		{name: "responses", fn: func(k, v *yaml.Node) {
			n, _ := p.int(k, v, 0, 1<<20)
			o.Responses = int(n)
		}},
		{name: "maxSessions", fn: func(k, v *yaml.Node) {
			n, _ := p.int(k, v, 1, 1<<24)
			o.MaxSessions = int(n)
		}},
	})
}

// timeouts parses a timeouts mapping (instance defaults or one service's).
// Defaults and range checks are policy.Compile's; firstByte and idle also
// take "off", kept as a negative duration.
func (p *yparser) timeouts(t *policy.Timeouts, v *yaml.Node) {
	dur := func(dst *time.Duration) func(k, v *yaml.Node) {
		return func(k, v *yaml.Node) {
			if d, ok := p.positive(k, v); ok {
				*dst = d
			}
		}
	}
	offOr := func(dst *time.Duration) func(k, v *yaml.Node) {
		return func(k, v *yaml.Node) {
			if x := p.deref(v); x != nil && x.Kind == yaml.ScalarNode && x.Value == "off" {
				*dst = -1
				return
			}
			dur(dst)(k, v)
		}
	}
	p.mapping(v, "timeouts", []field{
		{name: "handshake", fn: dur(&t.Handshake)},
		{name: "connect", fn: dur(&t.Connect)},
		{name: "firstByte", fn: offOr(&t.FirstByte)},
		{name: "idle", fn: offOr(&t.Idle)},
		{name: "requestRead", fn: dur(&t.RequestRead)},
		{name: "inFlightPerVIP", fn: func(k, v *yaml.Node) {
			n, _ := p.int(k, v, 1, policy.MaxInFlightPerVIP)
			t.InFlightPerVIP = int(n)
		}},
	})
}

func (p *yparser) instance(v *yaml.Node) {
	in := &p.b.cfg.Instance
	var miAt, riAt *yaml.Node
	p.mapping(v, "instance", []field{
		{name: "name", fn: func(k, v *yaml.Node) { in.Name, _ = p.str(k, v) }},
		{name: "limits", fn: func(_, v *yaml.Node) { p.limits(&in.Limits, v) }},
		{name: "clientLimits", fn: func(_, v *yaml.Node) { p.clientLimits(&in.ClientLimits, v) }},
		{name: "bandwidthBytes", fn: func(k, v *yaml.Node) {
			in.BandwidthBytes, _ = parse(p, k, v, "payload or wire", policy.ParseByteCount)
		}},
		{name: "metricInterval", fn: func(k, v *yaml.Node) {
			d, ok := p.positive(k, v)
			if ok {
				in.MetricInterval, miAt = d, k
			}
		}},
		{name: "recomputeInterval", fn: func(k, v *yaml.Node) {
			d, ok := p.positive(k, v)
			if ok {
				in.RecomputeInterval, riAt = d, k
			}
		}},
		{name: "timeouts", fn: func(_, v *yaml.Node) { p.timeouts(&in.Timeouts, v) }},
	})
	if miAt == nil && riAt == nil {
		return
	}
	mi, ri := in.MetricInterval, in.RecomputeInterval
	if mi == 0 {
		mi = policy.DefaultMetricInterval
	}
	if ri == 0 {
		ri = policy.DefaultRecomputeInterval
	}
	if ri > mi || mi%ri != 0 {
		at := riAt
		if at == nil {
			at = miAt
		}
		p.errf(at, "metricInterval %v must be a multiple of recomputeInterval %v", mi, ri)
	}
}

func (p *yparser) class(n *yaml.Node) {
	d := &classDef{c: &policy.Class{}}
	var nameAt *yaml.Node
	p.mapping(n, "class", []field{
		{name: "name", required: true, fn: func(k, v *yaml.Node) { d.c.Name, _ = p.str(k, v); nameAt = v }},
		{name: "parent", fn: func(k, v *yaml.Node) {
			d.parent, _ = p.str(k, v)
			if x := p.deref(v); x != nil {
				d.parentAt = p.pos(x)
			}
		}},
		{name: "limits", fn: func(_, v *yaml.Node) { p.limits(&d.c.Limits, v) }},
	})
	if d.c.Name == "" {
		return
	}
	d.at = p.at(nameAt)
	p.b.addClass(d)
}

func (p *yparser) service(n *yaml.Node) {
	vs := &policy.VirtualServer{}
	d := &serviceDef{vs: vs}
	var nameAt *yaml.Node
	var primaries, backups []*policy.Target
	targetAt := map[string]Pos{}
	var healthAt healthKeys
	p.mapping(n, "service", []field{
		{name: "name", required: true, fn: func(k, v *yaml.Node) { vs.Name, _ = p.str(k, v); nameAt = v }},
		{name: "class", fn: func(k, v *yaml.Node) {
			d.class, _ = p.str(k, v)
			if x := p.deref(v); x != nil {
				d.classAt = p.pos(x)
			}
		}},
		{name: "vips", required: true, fn: func(k, v *yaml.Node) {
			p.seq(k, v, func(item *yaml.Node) {
				a, ok := parse(p, k, item, "an address", parseVIP)
				if ok {
					vs.VIPs = append(vs.VIPs, a)
					d.vipAt = append(d.vipAt, p.at(item))
				}
			})
			if x := p.deref(v); x != nil && isEmpty(x) {
				p.errf(x, "vips: a service needs at least one VIP")
			}
		}},
		{name: "port", required: true, fn: func(k, v *yaml.Node) { vs.Ports, _ = parse(p, k, v, "a port", parsePortRange) }},
		{name: "protocol", fn: func(k, v *yaml.Node) {
			vs.Proto, _ = parse(p, k, v, "tcp, http, tls or udp", policy.ParseServiceProto)
		}},
		{name: "sni", fn: func(k, v *yaml.Node) { p.sni(vs, k, v) }},
		{name: "limits", fn: func(_, v *yaml.Node) { p.limits(&vs.Limits, v) }},
		{name: "clientLimits", fn: func(_, v *yaml.Node) { p.clientLimits(&vs.ClientLimits, v) }},
		{name: "timeouts", fn: func(_, v *yaml.Node) { p.timeouts(&vs.Timeouts, v) }},
		{name: "http", fn: func(_, v *yaml.Node) { p.httpOptions(&vs.HTTP, v) }},
		{name: "udp", fn: func(_, v *yaml.Node) { p.udpOptions(&vs.UDP, v) }},
		{name: "hashBy", fn: func(k, v *yaml.Node) {
			if h, ok := parse(p, k, v, "connection, client, header:NAME or cookie:NAME", policy.ParseHashBy); ok {
				vs.HashBy = &h
			}
		}},
		{name: "healthCheck", fn: func(k, v *yaml.Node) {
			vs.Health = &policy.HealthCheck{}
			healthAt = p.healthCheck(vs.Health, v)
			healthAt.key = k
		}},
		{name: "acceptProxyProtocol", fn: func(k, v *yaml.Node) {
			vs.AcceptProxy, _ = parse(p, k, v, "v1, v2 or any", func(s string) (policy.ProxyProtocol, error) {
				return policy.ParseProxyProtocol(s, true)
			})
		}},
		{name: "trustedProxies", fn: func(k, v *yaml.Node) {
			p.seq(k, v, func(item *yaml.Node) {
				if pf, ok := parse(p, k, item, "a prefix", parsePrefix); ok {
					vs.TrustedProxies = append(vs.TrustedProxies, pf)
				}
			})
		}},
		{name: "targets", required: true, fn: func(k, v *yaml.Node) {
			p.seq(k, v, func(item *yaml.Node) {
				t, at := p.target(item)
				if t == nil {
					return
				}
				if first, ok := targetAt[t.Name]; ok {
					p.b.e.add(at, "duplicate target %q (first defined at %s)", t.Name, first)
					return
				}
				targetAt[t.Name] = at
				if t.Role == policy.RoleBackup {
					backups = append(backups, t)
				} else {
					primaries = append(primaries, t)
				}
			})
			if x := p.deref(v); x != nil && isEmpty(x) {
				p.errf(x, "targets: a service needs at least one target")
			}
		}},
	})
	vs.Targets = append(primaries, backups...)
	p.serviceHealth(vs, healthAt)
	if vs.Name == "" {
		return
	}
	d.at = p.at(nameAt)
	p.b.addService(d)
}

// sni parses a tls service's server names: a list of names and
// wildcards ("*.example.com"), in which "default" makes the service its
// VIP and port's default, or "default" alone. Compile checks the names.
func (p *yparser) sni(vs *policy.VirtualServer, k, v *yaml.Node) {
	add := func(item *yaml.Node) {
		s, ok := p.str(k, item)
		switch {
		case !ok:
		case s == "default":
			if vs.SNIDefault {
				p.errf(item, "%s: default given twice", k.Value)
			}
			vs.SNIDefault = true
		default:
			vs.SNI = append(vs.SNI, s)
		}
	}
	if x := p.deref(v); x != nil && x.Kind == yaml.ScalarNode && !isNull(x) {
		add(x)
		return
	}
	p.seq(k, v, add)
	if x := p.deref(v); x != nil && isEmpty(x) {
		p.errf(x, "sni: want server names or default")
	}
}

// target parses one target; it returns nil when the target is unusable.
func (p *yparser) target(n *yaml.Node) (*policy.Target, Pos) {
	t := &policy.Target{Weight: 1}
	var at Pos
	var nameAt *yaml.Node
	p.mapping(n, "target", []field{
		{name: "name", fn: func(k, v *yaml.Node) { t.Name, _ = p.str(k, v); nameAt = v }},
		{name: "address", required: true, fn: func(k, v *yaml.Node) {
			t.Addr, _ = parse(p, k, v, "IP:port", parseTargetAddr)
			if nameAt == nil {
				if x := p.deref(v); x != nil {
					at = p.pos(x)
				}
			}
		}},
		{name: "weight", fn: func(k, v *yaml.Node) {
			w, _ := p.int(k, v, 0, maxWeight)
			t.Weight = int(w)
		}},
		{name: "maxConnections", fn: func(k, v *yaml.Node) { t.MaxConnections, _ = p.int(k, v, -1, math.MaxInt64) }},
		{name: "role", fn: func(k, v *yaml.Node) {
			t.Role, _ = parse(p, k, v, "primary or backup", func(s string) (policy.Role, error) {
				switch s {
				case "primary":
					return policy.RolePrimary, nil
				case "backup":
					return policy.RoleBackup, nil
				}
				return 0, fmt.Errorf("want primary or backup, got %q", s)
			})
		}},
		{name: "via", fn: func(k, v *yaml.Node) {
			t.Via, _ = parse(p, k, v, "host or netstack", func(s string) (policy.DialVia, error) {
				switch s {
				case "host":
					return policy.DialHost, nil
				case "netstack":
					return policy.DialNetstack, nil
				}
				return 0, fmt.Errorf("want host or netstack, got %q", s)
			})
		}},
		{name: "proxyProtocol", fn: func(k, v *yaml.Node) {
			t.ProxyProtocol, _ = parse(p, k, v, "v1 or v2", func(s string) (policy.ProxyProtocol, error) {
				return policy.ParseProxyProtocol(s, false)
			})
		}},
	})
	if !t.Addr.IsValid() {
		return nil, at
	}
	if nameAt != nil {
		if x := p.deref(nameAt); x != nil {
			at = p.pos(x)
		}
	}
	if t.Name == "" {
		t.Name = t.DefaultName()
	}
	return t, at
}

func (p *yparser) action(n *yaml.Node) {
	a := &policy.Action{}
	var nameAt *yaml.Node
	p.mapping(n, "action", []field{
		{name: "name", required: true, fn: func(k, v *yaml.Node) { a.Name, _ = p.str(k, v); nameAt = v }},
		{name: "outgoingTOS", fn: func(k, v *yaml.Node) {
			tos, ok := parse(p, k, v, "a ToS byte", parseTOS)
			a.OutgoingTOS, a.SetTOS = tos, ok
		}},
		{name: "minRate", fn: func(k, v *yaml.Node) { a.MinRate, _ = p.int(k, v, 0, math.MaxInt64) }},
		{name: "meanRate", fn: func(k, v *yaml.Node) { a.MeanRate, _ = p.int(k, v, 0, math.MaxInt64) }},
		{name: "maxConnections", fn: func(k, v *yaml.Node) { a.MaxConnections, _ = p.int(k, v, -1, math.MaxInt64) }},
	})
	if a.Name == "" {
		return
	}
	p.b.addAction(&actionDef{a: a, at: p.at(nameAt)})
}

func (p *yparser) rule(n *yaml.Node) {
	r := &policy.Rule{}
	d := &ruleDef{r: r}
	var nameAt *yaml.Node
	p.mapping(n, "rule", []field{
		{name: "name", required: true, fn: func(k, v *yaml.Node) { r.Name, _ = p.str(k, v); nameAt = v }},
		{name: "protocol", fn: func(k, v *yaml.Node) {
			type pr struct{ lo, hi uint8 }
			x, _ := parse(p, k, v, "a protocol number range", func(s string) (pr, error) {
				lo, hi, err := parseProtoRange(s)
				return pr{lo, hi}, err
			})
			r.ProtoLo, r.ProtoHi = x.lo, x.hi
		}},
		{name: "sourcePorts", fn: func(k, v *yaml.Node) { r.SrcPort, _ = parse(p, k, v, "a port range", parsePortRange) }},
		{name: "destinationPorts", fn: func(k, v *yaml.Node) { r.DstPort, _ = parse(p, k, v, "a port range", parsePortRange) }},
		{name: "sourcePrefix", fn: func(k, v *yaml.Node) { r.Src, _ = parse(p, k, v, "a prefix", parsePrefix) }},
		{name: "destinationPrefix", fn: func(k, v *yaml.Node) { r.Dst, _ = parse(p, k, v, "a prefix", parsePrefix) }},
		{name: "service", fn: func(k, v *yaml.Node) {
			d.service, _ = p.str(k, v)
			if x := p.deref(v); x != nil {
				d.serviceAt = p.pos(x)
			}
		}},
		{name: "action", required: true, fn: func(k, v *yaml.Node) {
			d.action, _ = p.str(k, v)
			if x := p.deref(v); x != nil {
				d.actionAt = p.pos(x)
			}
		}},
	})
	if r.Name == "" || d.action == "" {
		return
	}
	p.b.addRule(d, p.at(nameAt))
}

func (p *yparser) monitor(m *policy.Monitor, v *yaml.Node) {
	m.Enabled = true
	// pair parses [ratio, fraction]: tenths of a percent and a percent.
	pair := func(k, v *yaml.Node, t, f *int) {
		l := p.deref(v)
		if l == nil {
			return
		}
		if l.Kind != yaml.SequenceNode || len(l.Content) != 2 {
			p.errf(l, "%s: want [ratio, fraction], two integers, got %s", k.Value, describeLen(l))
			return
		}
		x, ok1 := p.int(k, l.Content[0], 1, maxRatio)
		y, ok2 := p.int(k, l.Content[1], 1, maxFraction)
		if ok1 && ok2 {
			*t, *f = int(x), int(y)
		}
	}
	frac := func(k, v *yaml.Node, f *int) {
		x, _ := p.int(k, v, 1, maxFraction)
		*f = int(x)
	}
	p.mapping(v, "monitor", []field{
		{name: "enabled", fn: func(k, v *yaml.Node) { m.Enabled, _ = p.bool(k, v) }},
		{name: "samplingInterval", fn: func(k, v *yaml.Node) {
			d, _ := p.positive(k, v)
			m.SamplingInterval = d
		}},
		{name: "lossRatioAndWeightFr", fn: func(k, v *yaml.Node) { pair(k, v, &m.LossThreshold, &m.LossStep) }},
		{name: "timeoutRatioAndWeightFr", fn: func(k, v *yaml.Node) { pair(k, v, &m.TimeoutThreshold, &m.TimeoutStep) }},
		{name: "direction", fn: func(k, v *yaml.Node) {
			m.Direction, _ = parse(p, k, v, "a direction", policy.ParseDirection)
		}},
		{name: "scope", fn: func(k, v *yaml.Node) { m.Scope, _ = parse(p, k, v, "a scope", policy.ParseScope) }},
		{name: "lossMaxWeightFr", fn: func(k, v *yaml.Node) { frac(k, v, &m.LossMax) }},
		{name: "timeoutMaxWeightFr", fn: func(k, v *yaml.Node) { frac(k, v, &m.TimeoutMax) }},
		{name: "hostCapture", fn: func(k, v *yaml.Node) {
			m.HostCaptureOff, _ = parse(p, k, v, "on or off", parseOnOff)
		}},
		{name: "minSegments", fn: func(k, v *yaml.Node) {
			x, _ := p.int(k, v, 1, maxMinSegments)
			m.MinSegments = int(x)
		}},
		{name: "errorRatioAndWeightFr", fn: func(k, v *yaml.Node) { pair(k, v, &m.ErrorThreshold, &m.ErrorStep) }},
		{name: "errorMaxWeightFr", fn: func(k, v *yaml.Node) { frac(k, v, &m.ErrorMax) }},
		{name: "errorMinResponses", fn: func(k, v *yaml.Node) {
			x, _ := p.int(k, v, 1, maxMinSegments)
			m.MinResponses = int(x)
		}},
		{name: "errorCountsFailures", fn: func(k, v *yaml.Node) { m.ErrorCountsFailures, _ = p.bool(k, v) }},
		{name: "maxConnWeightFr", fn: func(k, v *yaml.Node) {
			x, ok := p.ints(k, v, 3, 1, maxFraction)
			if !ok {
				return
			}
			if x[0] >= x[1] || x[1] >= x[2] {
				p.errf(p.deref(v), "%s: levels %d %d %d must ascend", k.Value, x[0], x[1], x[2])
				return
			}
			m.MaxConnLevels = [3]int{int(x[0]), int(x[1]), int(x[2])}
		}},
	})
}

func (p *yparser) balancer(b *policy.BalancerSettings, v *yaml.Node) {
	p.mapping(v, "balancer", []field{
		{name: "algorithm", fn: func(k, v *yaml.Node) {
			b.Algorithm, _ = parse(p, k, v, "an algorithm", policy.ParseAlgorithm)
		}},
		{name: "retryInterval", fn: func(k, v *yaml.Node) {
			d, _ := p.positive(k, v)
			b.RetryInterval = d
		}},
		{name: "maxAttempts", fn: func(k, v *yaml.Node) {
			x, _ := p.int(k, v, 1, maxAttempts)
			b.MaxAttempts = int(x)
		}},
		{name: "refreshInterval", fn: func(k, v *yaml.Node) { b.RefreshInterval, _ = parse(p, k, v, "a duration", parseDuration) }},
		{name: "slowStart", fn: func(k, v *yaml.Node) { b.SlowStart, _ = parse(p, k, v, "a duration", parseDuration) }},
		{name: "healthCheck", fn: func(_, v *yaml.Node) {
			if at := p.healthCheck(&b.Health, v); at.udp != nil {
				p.errf(at.udp, "udp: a udp probe belongs in a udp service's own healthCheck (the balancer's is every tcp, http and tls service's)")
			}
		}},
		{name: "hashBy", fn: func(k, v *yaml.Node) {
			b.HashBy, _ = parse(p, k, v, "connection, client, header:NAME or cookie:NAME", policy.ParseHashBy)
		}},
		{name: "ejection", fn: func(_, v *yaml.Node) { p.ejection(&b.Ejection, v) }},
	})
}

// ejection parses balancer.ejection; consecutiveFailures is required.
func (p *yparser) ejection(e *policy.Ejection, v *yaml.Node) {
	p.mapping(v, "ejection", []field{
		{name: "consecutiveFailures", required: true, fn: func(k, v *yaml.Node) {
			x, _ := p.int(k, v, 1, maxHealthRuns)
			e.ConsecutiveFailures = int(x)
		}},
		{name: "for", fn: func(k, v *yaml.Node) {
			d, _ := p.positive(k, v)
			e.For = d
		}},
		{name: "maxPercent", fn: func(k, v *yaml.Node) {
			x, _ := p.int(k, v, 1, maxFraction)
			e.MaxPercent = int(x)
		}},
		{name: "serverErrors", fn: func(k, v *yaml.Node) { e.ServerErrors, _ = p.bool(k, v) }},
	})
}

// healthKeys are where a health check's keys are, for the checks that
// need the service around it: the healthCheck key, its udp key and the
// first of its tcp probe keys (http, send, expect); nil where absent.
type healthKeys struct{ key, udp, tcp *yaml.Node }

// serviceHealth checks a service's own health check against its protocol:
// a udp service's takes the udp probe and only that; no other service's
// takes it.
func (p *yparser) serviceHealth(vs *policy.VirtualServer, at healthKeys) {
	switch {
	case at.key == nil:
	case vs.Proto == policy.ProtoUDP && at.tcp != nil:
		p.errf(at.tcp, "%s: a udp service's health check is udp: {send, expect} (%s speaks TCP)", at.tcp.Value, at.tcp.Value)
	case vs.Proto == policy.ProtoUDP && at.udp == nil:
		p.errf(at.key, "healthCheck: a udp service's health check needs udp: {send, expect} (the tcp, http and send/expect checks speak TCP)")
	case vs.Proto != policy.ProtoUDP && at.udp != nil:
		p.errf(at.udp, "udp: a udp health check needs protocol udp, not %v", vs.Proto)
	}
}

// healthCheck parses a health check: the balancer's or a service's own.
// It returns where its probe keys are (healthKeys.key is the caller's).
func (p *yparser) healthCheck(h *policy.HealthCheck, v *yaml.Node) (at healthKeys) {
	var timeoutAt, httpAt *yaml.Node
	tcp := func(k *yaml.Node) {
		if at.tcp == nil {
			at.tcp = k
		}
	}
	p.mapping(v, "healthCheck", []field{
		{name: "interval", fn: func(k, v *yaml.Node) { h.Interval, _ = parse(p, k, v, "a duration", parseDuration) }},
		{name: "timeout", fn: func(k, v *yaml.Node) {
			h.Timeout, _ = parse(p, k, v, "a duration", parseDuration)
			timeoutAt = k
		}},
		{name: "rise", fn: func(k, v *yaml.Node) {
			x, _ := p.int(k, v, 1, maxHealthRuns)
			h.Rise = int(x)
		}},
		{name: "fall", fn: func(k, v *yaml.Node) {
			x, _ := p.int(k, v, 1, maxHealthRuns)
			h.Fall = int(x)
		}},
		{name: "http", fn: func(k, v *yaml.Node) {
			httpAt = k
			tcp(k)
			x := &policy.HTTPCheck{}
			h.HTTP = x
			p.mapping(v, "http", []field{
				{name: "method", fn: func(k, v *yaml.Node) { x.Method, _ = parse(p, k, v, "a method", parseHTTPMethod) }},
				{name: "path", fn: func(k, v *yaml.Node) { x.Path, _ = parse(p, k, v, "a path", parseHTTPPath) }},
				{name: "host", fn: func(k, v *yaml.Node) { x.Host, _ = parse(p, k, v, "a host", parseHTTPHost) }},
				{name: "expectStatus", fn: func(k, v *yaml.Node) {
					x.Status, _ = parse(p, k, v, "a status or range (200-399)", policy.ParseStatusRange)
				}},
			})
		}},
		{name: "udp", fn: func(k, v *yaml.Node) {
			at.udp = k
			h.UDP = &policy.UDPCheck{}
			p.udpCheck(h.UDP, v)
		}},
		{name: "send", fn: func(k, v *yaml.Node) { h.Send, _ = p.str(k, v); tcp(k) }},
		{name: "expect", fn: func(k, v *yaml.Node) {
			tcp(k)
			x := v
			for x != nil && x.Kind == yaml.AliasNode {
				x = x.Alias
			}
			if x == nil || x.Kind != yaml.MappingNode {
				h.Expect, _ = p.str(k, v)
				return
			}
			p.mapping(v, "expect", []field{
				{name: "regexp", required: true, fn: func(k, v *yaml.Node) {
					h.ExpectRegexp, _ = parse(p, k, v, "a regular expression", parseRegexp)
				}},
			})
		}},
	})
	if timeoutAt != nil && h.Interval > 0 && h.Timeout >= h.Interval {
		p.errf(timeoutAt, "timeout %v must be shorter than interval %v", h.Timeout, h.Interval)
	}
	if httpAt != nil && (h.Send != "" || h.Expect != "" || h.ExpectRegexp != nil) {
		p.errf(httpAt, "http: a check is http or send/expect, not both")
	}
	return at
}

// udpCheck parses a health check's udp probe: send (text, {hex} or {dns,
// type}) and expect (text, {hex}, {regexp}, or with dns {rcode}).
func (p *yparser) udpCheck(x *policy.UDPCheck, v *yaml.Node) {
	var expectAt, rcodeAt *yaml.Node
	rcode := 0
	p.mapping(v, "udp", []field{
		{name: "send", required: true, fn: func(k, v *yaml.Node) {
			if !isMapping(v) {
				if t, ok := p.str(k, v); ok {
					x.Send = []byte(t)
				}
				return
			}
			var d *policy.DNSCheck
			before := len(p.b.e.list) + p.b.e.dropped
			p.mapping(v, "send", []field{
				{name: "hex", fn: func(k, v *yaml.Node) { x.Send, _ = parse(p, k, v, "hex digits", parseHex) }},
				{name: "dns", fn: func(k, v *yaml.Node) {
					if d == nil {
						d = &policy.DNSCheck{}
					}
					d.Name, _ = parse(p, k, v, "a domain name", policy.ParseDNSName)
				}},
				{name: "type", fn: func(k, v *yaml.Node) {
					if d == nil {
						d = &policy.DNSCheck{}
					}
					d.Type, _ = parse(p, k, v, "a DNS type (A, AAAA, ...)", policy.ParseDNSType)
				}},
			})
			switch {
			case d != nil && x.Send != nil:
				p.errf(k, "send: hex or dns, not both")
			case d != nil && d.Name == "":
				p.errf(k, "send: type needs dns: NAME")
			case d == nil && x.Send == nil && len(p.b.e.list)+p.b.e.dropped == before:
				p.errf(k, "send: want text, {hex: BYTES} or {dns: NAME}")
			}
			x.DNS = d
		}},
		{name: "expect", fn: func(k, v *yaml.Node) {
			expectAt = k
			if !isMapping(v) {
				if t, ok := p.str(k, v); ok {
					x.Expect = []byte(t)
				}
				return
			}
			p.mapping(v, "expect", []field{
				{name: "hex", fn: func(k, v *yaml.Node) { x.Expect, _ = parse(p, k, v, "hex digits", parseHex) }},
				{name: "regexp", fn: func(k, v *yaml.Node) {
					x.ExpectRegexp, _ = parse(p, k, v, "a regular expression", parseRegexp)
				}},
				{name: "rcode", fn: func(k, v *yaml.Node) {
					rcodeAt = k
					rcode, _ = parse(p, k, v, "a DNS rcode (NOERROR, NXDOMAIN, ..., any)", policy.ParseDNSRCode)
				}},
			})
			n := 0
			for _, set := range []bool{x.Expect != nil, x.ExpectRegexp != nil, rcodeAt != nil} {
				if set {
					n++
				}
			}
			if n > 1 {
				p.errf(k, "expect: one of text, hex, regexp or rcode")
			}
		}},
	})
	switch {
	case x.DNS != nil && expectAt != nil && rcodeAt == nil:
		p.errf(expectAt, "expect: send dns judges the reply by its ID, QR bit and rcode: expect takes only {rcode: NOERROR|NXDOMAIN|...|any}")
	case x.DNS == nil && rcodeAt != nil:
		p.errf(rcodeAt, "rcode: needs send {dns: NAME}")
	case x.DNS != nil:
		x.DNS.RCode = rcode
	}
}

// isMapping reports whether n is a mapping, following aliases (without
// charging the budget: the handler that reads n charges it).
func isMapping(n *yaml.Node) bool {
	for n != nil && n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	return n != nil && n.Kind == yaml.MappingNode
}

// cluster parses the scale-out section; redis and name are required.
func (p *yparser) cluster(v *yaml.Node) *policy.Cluster {
	cl := &policy.Cluster{}
	p.mapping(v, "cluster", []field{
		{name: "redis", required: true, fn: func(k, v *yaml.Node) {
			cl.Redis, _ = parse(p, k, v, "an address or URL", parseRedisAddr)
		}},
		{name: "name", required: true, fn: func(k, v *yaml.Node) { cl.Name, _ = parse(p, k, v, "a name", parseKeyName) }},
		{name: "instance", fn: func(k, v *yaml.Node) { cl.Instance, _ = parse(p, k, v, "a name", parseKeyName) }},
		{name: "leaseInterval", fn: func(k, v *yaml.Node) {
			d, ok := p.positive(k, v)
			if ok && (d < 10*time.Millisecond || d > time.Minute) {
				p.errf(p.deref(v), "%s: %v is out of range 10ms..1m", k.Value, d)
				return
			}
			cl.LeaseInterval = d
		}},
		{name: "onRedisDown", fn: func(k, v *yaml.Node) {
			cl.OnRedisDown, _ = parse(p, k, v, "localShare, failOpen or failClosed", policy.ParseRedisDown)
		}},
		{name: "borrowTimeout", fn: func(k, v *yaml.Node) {
			d, ok := p.positive(k, v)
			if ok && d > 30*time.Second {
				p.errf(p.deref(v), "%s: %v is out of range 0..30s", k.Value, d)
				return
			}
			cl.BorrowTimeout = d
		}},
	})
	return cl
}

// parseRedisAddr accepts host:port or a redis:// or rediss:// URL with a
// host.
func parseRedisAddr(s string) (string, error) {
	if strings.Contains(s, "://") {
		u, err := url.Parse(s)
		if err != nil {
			return "", fmt.Errorf("bad URL: %v", err)
		}
		if u.Scheme != "redis" && u.Scheme != "rediss" {
			return "", fmt.Errorf("URL scheme %q: want redis or rediss", u.Scheme)
		}
		if u.Host == "" {
			return "", fmt.Errorf("URL %q has no host", s)
		}
		return s, nil
	}
	host, port, err := net.SplitHostPort(s)
	if err != nil || host == "" {
		return "", fmt.Errorf("%q: want host:port or a redis:// URL", s)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return "", fmt.Errorf("%q: port must be 1..65535", s)
	}
	return s, nil
}

// parseKeyName accepts a name that can be part of a Redis key: printable,
// no spaces, no hash-tag braces, at most 64 bytes.
func parseKeyName(s string) (string, error) {
	if s == "" || len(s) > 64 {
		return "", fmt.Errorf("%q: want 1 to 64 characters", s)
	}
	for _, r := range s {
		if r <= ' ' || r == 0x7f || r == '{' || r == '}' {
			return "", fmt.Errorf("%q: spaces, control characters and { } are not allowed", s)
		}
	}
	return s, nil
}

// ParseYAML parses a YAML config, with the Policy Agent files it includes
// read from the file system relative to name's directory. See the package
// documentation for the schema. Errors are an ErrorList.
func ParseYAML(name string, data []byte) (*policy.Config, error) {
	return Parser{}.ParseYAML(name, data)
}

// ParseYAML is the package-level ParseYAML with p's file access.
func (p Parser) ParseYAML(name string, data []byte) (*policy.Config, error) {
	b := newBuilder()
	b.e.file(name)
	yp := &yparser{b: b, file: name, budget: nodeBudget}
	includes := yp.parseYAML(data)
	for _, inc := range includes {
		path := inc.path
		if !filepath.IsAbs(path) {
			path = filepath.Join(filepath.Dir(name), path)
		}
		data, err := p.read(path)
		if err != nil {
			b.e.add(inc.at, "include %q: %v", inc.path, pathErr(err))
			continue
		}
		parsePA(b, path, data)
	}
	return b.finish(name)
}
