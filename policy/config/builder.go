package config

import (
	"fmt"
	"net/netip"
	"os"
	"strings"

	"weir/policy"
)

// builder assembles one policy.Config from a YAML file and the Policy Agent
// files it includes, collecting every error with its position. Names are
// resolved at the end, so a rule may name an action defined later or in
// another file.
type builder struct {
	e   errs
	cfg policy.Config

	classes   map[string]*classDef
	classList []*classDef
	services  map[string]*serviceDef
	svcList   []*serviceDef
	actions   map[string]*actionDef
	rules     map[string]Pos
	ruleList  []*ruleDef
	monitorAt *Pos
}

type classDef struct {
	c        *policy.Class
	at       Pos // the name
	parent   string
	parentAt Pos
}

type serviceDef struct {
	vs      *policy.VirtualServer
	at      Pos
	class   string
	classAt Pos
	vipAt   []Pos // one per vs.VIPs entry
}

type actionDef struct {
	a  *policy.Action
	at Pos
}

type ruleDef struct {
	r         *policy.Rule
	action    string
	actionAt  Pos
	service   string // "" for any
	serviceAt Pos
}

func newBuilder() *builder {
	return &builder{
		classes:  map[string]*classDef{},
		services: map[string]*serviceDef{},
		actions:  map[string]*actionDef{},
		rules:    map[string]Pos{},
	}
}

func (b *builder) addClass(d *classDef) {
	if first, ok := b.classes[d.c.Name]; ok {
		b.e.add(d.at, "duplicate class %q (first defined at %s)", d.c.Name, first.at)
		return
	}
	b.classes[d.c.Name] = d
	b.classList = append(b.classList, d)
	b.cfg.Classes = append(b.cfg.Classes, d.c)
}

func (b *builder) addService(d *serviceDef) {
	if first, ok := b.services[d.vs.Name]; ok {
		b.e.add(d.at, "duplicate service %q (first defined at %s)", d.vs.Name, first.at)
		return
	}
	b.services[d.vs.Name] = d
	b.svcList = append(b.svcList, d)
	b.cfg.Services = append(b.cfg.Services, d.vs)
}

func (b *builder) addAction(d *actionDef) {
	if first, ok := b.actions[d.a.Name]; ok {
		b.e.add(d.at, "duplicate action %q (first defined at %s)", d.a.Name, first.at)
		return
	}
	b.actions[d.a.Name] = d
	b.cfg.Actions = append(b.cfg.Actions, d.a)
}

func (b *builder) addRule(d *ruleDef, at Pos) {
	if first, ok := b.rules[d.r.Name]; ok {
		b.e.add(at, "duplicate rule %q (first defined at %s)", d.r.Name, first)
		return
	}
	b.rules[d.r.Name] = at
	b.ruleList = append(b.ruleList, d)
	b.cfg.Rules = append(b.cfg.Rules, d.r)
}

// setMonitor records where the monitor is defined; it may be defined once.
func (b *builder) setMonitor(at Pos) bool {
	if b.monitorAt != nil {
		b.e.add(at, "monitor defined twice (first defined at %s)", *b.monitorAt)
		return false
	}
	b.monitorAt = &at
	return true
}

// resolve links names to objects and checks what needs the whole file:
// class references and chains, rule actions and services, VIP:port claims.
func (b *builder) resolve() {
	for _, d := range b.classList {
		if d.parent == "" {
			continue
		}
		p, ok := b.classes[d.parent]
		if !ok {
			b.e.add(d.parentAt, "unknown class %q%s", d.parent, suggest(d.parent, b.classNames()))
			continue
		}
		d.c.Parent = p.c
	}
	b.checkClassLoops()
	for _, d := range b.svcList {
		if d.class == "" {
			continue
		}
		c, ok := b.classes[d.class]
		if !ok {
			b.e.add(d.classAt, "unknown class %q%s", d.class, suggest(d.class, b.classNames()))
			continue
		}
		d.vs.Class = c.c
	}
	for _, d := range b.ruleList {
		a, ok := b.actions[d.action]
		if !ok {
			var names []string
			for _, a := range b.cfg.Actions {
				names = append(names, a.Name)
			}
			b.e.add(d.actionAt, "rule %q names unknown action %q%s", d.r.Name, d.action, suggest(d.action, names))
		} else {
			d.r.Action = a.a
		}
		if d.service != "" {
			s, ok := b.services[d.service]
			if !ok {
				var names []string
				for _, s := range b.cfg.Services {
					names = append(names, s.Name)
				}
				b.e.add(d.serviceAt, "rule %q names unknown service %q%s", d.r.Name, d.service, suggest(d.service, names))
			} else {
				d.r.Service = s.vs
			}
		}
	}
	b.checkVIPClaims()
}

func (b *builder) classNames() []string {
	names := make([]string, len(b.classList))
	for i, d := range b.classList {
		names[i] = d.c.Name
	}
	return names
}

// checkClassLoops reports each parent cycle once, at the parent reference of
// its member defined first in the file.
func (b *builder) checkClassLoops() {
	index := map[*policy.Class]int{}
	for i, d := range b.classList {
		index[d.c] = i
	}
	reported := map[*policy.Class]bool{}
	for _, d := range b.classList {
		onPath := map[*policy.Class]int{}
		var path []*policy.Class
		for c := d.c; c != nil; c = c.Parent {
			if start, ok := onPath[c]; ok {
				cycle := path[start:]
				first := cycle[0]
				for _, m := range cycle {
					if reported[m] {
						first = nil
						break
					}
					if index[m] < index[first] {
						first = m
					}
				}
				if first == nil {
					break
				}
				for _, m := range cycle {
					reported[m] = true
				}
				// Name the loop starting at its first-defined member.
				var names []string
				for c := first; ; c = c.Parent {
					names = append(names, c.Name)
					if len(names) > 1 && c == first {
						break
					}
				}
				fd := b.classList[index[first]]
				b.e.add(fd.parentAt, "class %q: parent chain loops (%s)", first.Name, strings.Join(names, " → "))
				break
			}
			onPath[c] = len(path)
			path = append(path, c)
		}
	}
}

// checkVIPClaims reports every VIP whose port range another service already
// claims.
func (b *builder) checkVIPClaims() {
	type claim struct {
		d  *serviceDef
		at Pos
	}
	claims := map[netip.Addr][]claim{}
	for _, d := range b.svcList {
		for i, vip := range d.vs.VIPs {
			at := d.vipAt[i]
			for _, c := range claims[vip] {
				// A udp service shares a VIP and port with a tcp, http or
				// tls one (DNS on 53 over both): each IP protocol's
				// packets reach their own (policy.Compile).
				if c.d != d && c.d.vs.IPProto() != d.vs.IPProto() {
					continue
				}
				if c.d.vs.Ports.Overlaps(d.vs.Ports) {
					bothTLS := c.d.vs.Proto == policy.ProtoTLS && d.vs.Proto == policy.ProtoTLS
					if c.d != d && bothTLS {
						// tls services share ports, routed by server
						// name: policy.Compile checks their names.
						continue
					}
					if c.d == d {
						b.e.add(at, "service %q lists VIP %s twice (first at %s)", d.vs.Name, vip, c.at)
					} else {
						hint := ""
						if c.d.vs.Proto == policy.ProtoTLS || d.vs.Proto == policy.ProtoTLS {
							hint = " (only tls services share a port, routed by sni)"
						}
						b.e.add(at, "%s port %s already claimed by service %q at %s%s", vip, overlap(c.d.vs.Ports, d.vs.Ports), c.d.vs.Name, c.at, hint)
					}
					break
				}
			}
			claims[vip] = append(claims[vip], claim{d, at})
		}
	}
}

// overlap prints the ports two overlapping ranges share.
func overlap(a, b policy.PortRange) string {
	return policy.PortRange{Lo: max(a.Lo, b.Lo), Hi: min(a.Hi, b.Hi)}.String()
}

// finish resolves names and returns the compiled config, or every error.
func (b *builder) finish(name string) (*policy.Config, error) {
	b.resolve()
	if err := b.e.err(); err != nil {
		return nil, err
	}
	if b.cfg.Cluster != nil && b.cfg.Hostname == "" {
		// The cluster instance's default name: the host's, an input of
		// Compile (policy asks the system nothing).
		b.cfg.Hostname, _ = os.Hostname()
	}
	c, err := policy.Compile(&b.cfg)
	if err != nil {
		// The parsers check everything Compile does, with positions; this
		// is a safety net for a check that exists only in Compile.
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return c, nil
}
