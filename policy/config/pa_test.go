package config

import (
	"errors"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"weir/policy"
)

// seedBlock is the Policy Agent block of the z/OS seed document, verbatim
// (no final newline, as in the seed).
const seedBlock = `PolicyPerfMonitorForSDR enable
{
samplinginterval 60
LossRatioAndWeightFr 20 25
TimeoutRatioAndWeightFr 50 50
LossMaxWeightFr 95
TimeoutMaxWeightFr 100
MaxConnWeightFr 50 65 80
}
policyAction telnetGold
{
MinRate 500 # Provide minimum rate of 500 Kbps.
OutgoingTOS 10100000 # the TOS value of outgoing telnet packets.
}
policyRule targetelnet
{
ProtocolNumberRange 6
SourcePortRange 23
policyactionreference telnetGold
}`

func checkSeed(t *testing.T, c *policy.Config) {
	t.Helper()
	wantMon := policy.Monitor{Enabled: true, SamplingInterval: 60 * time.Second, LossThreshold: 20, LossStep: 25,
		TimeoutThreshold: 50, TimeoutStep: 50, LossMax: 95, TimeoutMax: 100, MaxConnLevels: [3]int{50, 65, 80}, MinSegments: policy.DefaultMinSegments}
	if c.Monitor != wantMon {
		t.Errorf("monitor = %+v", c.Monitor)
	}
	if len(c.Actions) != 1 || len(c.Rules) != 1 {
		t.Fatalf("%d actions, %d rules; want 1, 1", len(c.Actions), len(c.Rules))
	}
	a := c.Actions[0]
	if a.Name != "telnetGold" || !a.SetTOS || a.OutgoingTOS != 0xA0 || a.MinRate != 500 {
		t.Errorf("action = %+v", a)
	}
	r := c.Rules[0]
	if r.Name != "targetelnet" || r.ProtoLo != 6 || r.ProtoHi != 6 || r.SrcPort != (policy.PortRange{Lo: 23, Hi: 23}) ||
		!r.DstPort.Any() || r.Action != a {
		t.Errorf("rule = %+v", r)
	}
	// The rule selects the Telnet server's outbound traffic.
	vip := netip.MustParseAddrPort("198.18.0.23:23")
	client := netip.MustParseAddrPort("198.18.9.9:40000")
	if c.Classify(6, vip, client, nil) != a || c.Classify(17, vip, client, nil) != nil {
		t.Errorf("Classify does not pick telnetGold for TCP only")
	}
}

func TestParsePolicyAgentSeed(t *testing.T) {
	c, err := ParsePolicyAgent("seed.pa", []byte(seedBlock))
	if err != nil {
		t.Fatal(err)
	}
	checkSeed(t, c)
	if len(c.Services) != 0 {
		t.Errorf("services from a Policy Agent file: %v", c.Services)
	}
}

// TestSeedDocument loads the block straight from the seed document when it
// is present (it lives outside the repository), to prove the example is
// still verbatim.
func TestSeedDocument(t *testing.T) {
	doc, err := os.ReadFile("../../../shared/seeds/zos-sysplex-distributor-qos.txt")
	if err != nil {
		t.Skip("seed document not present:", err)
	}
	i := strings.Index(string(doc), "PolicyPerfMonitorForSDR enable")
	if i < 0 {
		t.Fatal("seed has no PolicyPerfMonitorForSDR block")
	}
	if got := strings.TrimRight(string(doc[i:]), "\n"); got != seedBlock {
		t.Errorf("seed block changed:\n%s", got)
	}
}

func TestParsePolicyAgentGood(t *testing.T) {
	tests := []struct {
		name  string
		text  string
		check func(t *testing.T, c *policy.Config)
	}{
		{"empty", "# nothing\n", func(t *testing.T, c *policy.Config) {
			if c.Monitor.Enabled || len(c.Rules) != 0 {
				t.Errorf("config = %+v", c)
			}
		}},
		{"one-line blocks, ranges, addresses, any case", `
POLICYACTION a { meanrate 2000 }
PolicyAction b {
  MaxConnections 40
  OutgoingTOS 0xB8
}
policyrule r1 {
  protocolnumberrange 6 17
  SourcePortRange 8000 8010
  DestinationPortRange 1024-65535
  SourceAddressRange 198.18.0.0 198.19.255.255
  DestinationAddressRange fd00::/64
  PolicyActionReference b
}
PolicyRule r2 { SourceAddressRange 198.18.0.7
PolicyActionReference a }
PolicyPerfMonitorForSDR disable
`, func(t *testing.T, c *policy.Config) {
			if c.Actions[0].MeanRate != 2000 || c.Actions[1].MaxConnections != 40 || c.Actions[1].OutgoingTOS != 0xB8 {
				t.Errorf("actions %+v %+v", c.Actions[0], c.Actions[1])
			}
			r := c.Rules[0]
			if r.ProtoLo != 6 || r.ProtoHi != 17 || r.SrcPort != (policy.PortRange{Lo: 8000, Hi: 8010}) ||
				r.DstPort != (policy.PortRange{Lo: 1024, Hi: 65535}) || r.Src != netip.MustParsePrefix("198.18.0.0/15") ||
				r.Dst != netip.MustParsePrefix("fd00::/64") || r.Action != c.Actions[1] {
				t.Errorf("r1 = %+v", r)
			}
			if c.Rules[1].Src != netip.MustParsePrefix("198.18.0.7/32") || c.Rules[1].Action != c.Actions[0] {
				t.Errorf("r2 = %+v", c.Rules[1])
			}
			if c.Monitor.Enabled {
				t.Errorf("monitor enabled")
			}
		}},
		{"rule before its action, CRLF line ends", "PolicyRule r\r\n{\r\nPolicyActionReference a\r\n}\r\nPolicyAction a\r\n", func(t *testing.T, c *policy.Config) {
			if c.Rules[0].Action != c.Actions[0] {
				t.Errorf("rule not linked")
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := ParsePolicyAgent("t.pa", []byte(tt.text))
			if err != nil {
				t.Fatalf("ParsePolicyAgent: %v", err)
			}
			tt.check(t, c)
		})
	}
}

func TestParsePolicyAgentErrors(t *testing.T) {
	tests := []struct {
		name string
		text string
		want string
	}{
		{"unknown statement", "PolicyActon a\n",
			`t.pa:1:1: unknown statement "PolicyActon" (want PolicyPerfMonitorForSDR, PolicyAction or PolicyRule) (did you mean "PolicyAction"?)`},
		{"unknown attribute", "PolicyAction a\n{\n  MinRat 5\n}\n",
			`t.pa:3:3: unknown attribute "MinRat" in PolicyAction a (did you mean "MinRate"?)`},
		{"unsupported attribute", "PolicyAction a\n{\n  MaxRate 5\n}\n",
			`t.pa:3:3: MaxRate is a Policy Agent attribute weir does not implement`},
		{"duplicate attribute", "PolicyAction a\n{\nMinRate 5\nminrate 6\n}\n",
			`t.pa:4:1: duplicate MinRate in PolicyAction a (first at line 3)`},
		{"bad binary TOS", "PolicyAction a { OutgoingTOS 1010000x }\n",
			`t.pa:1:30: OutgoingTOS: want a ToS byte: 8 binary digits (10100000), 0x and hex (0xA0), 0b and binary (0b101) or 0d and decimal 0..255 (0d160), got "1010000x"`},
		{"not a number", "PolicyAction a { MinRate fast }\n",
			`t.pa:1:26: MinRate: want an integer, got "fast"`},
		{"too many values", "PolicyAction a { MinRate 5 6 }\n",
			`t.pa:1:18: MinRate: want 1 value, got 2`},
		{"missing name", "PolicyAction\n{\n}\n",
			`t.pa:1:1: PolicyAction: want 1 value, got 0`},
		{"ratio out of range", "PolicyPerfMonitorForSDR enable\n{\nLossRatioAndWeightFr 2000 25\n}\n",
			`t.pa:3:22: LossRatioAndWeightFr: 2000 is out of range 1..1000`},
		{"fraction out of range", "PolicyPerfMonitorForSDR enable { TimeoutMaxWeightFr 0 }\n",
			`t.pa:1:53: TimeoutMaxWeightFr: 0 is out of range 1..100`},
		{"levels not ascending", "PolicyPerfMonitorForSDR enable { MaxConnWeightFr 80 65 50 }\n",
			`t.pa:1:50: MaxConnWeightFr: levels 80 65 50 must ascend`},
		{"enable misspelt", "PolicyPerfMonitorForSDR on\n",
			`t.pa:1:25: PolicyPerfMonitorForSDR: want enable or disable, got "on"`},
		{"monitor twice", "PolicyPerfMonitorForSDR enable\nPolicyPerfMonitorForSDR enable\n",
			`t.pa:2:1: monitor defined twice (first defined at t.pa:1:1)`},
		{"port out of range", "PolicyAction a\nPolicyRule r { SourcePortRange 0\nPolicyActionReference a }\n",
			`t.pa:2:32: SourcePortRange: port 0 is out of range 1..65535`},
		{"address range not a prefix", "PolicyAction a\nPolicyRule r { SourceAddressRange 198.18.0.1 198.18.0.9\nPolicyActionReference a }\n",
			`t.pa:2:35: SourceAddressRange: address range 198.18.0.1 198.18.0.9 is not a prefix (weir matches prefixes)`},
		{"unknown action", "PolicyRule r\n{\nPolicyActionReference telnetGld\n}\nPolicyAction telnetGold\n",
			`t.pa:3:23: rule "r" names unknown action "telnetGld" (did you mean "telnetGold"?)`},
		{"rule without action", "PolicyRule r\n{\nProtocolNumberRange 6\n}\n",
			`t.pa:1:1: PolicyRule r has no PolicyActionReference`},
		{"duplicate action", "PolicyAction a\nPolicyAction a\n",
			`t.pa:2:14: duplicate action "a" (first defined at t.pa:1:14)`},
		{"unclosed block", "PolicyAction a\n{\nMinRate 5\n",
			`t.pa:2:1: unclosed { (no matching })`},
		{"stray close", "}\n",
			`t.pa:1:1: } without a matching {`},
		{"block without statement", "{ }\n",
			`t.pa:1:1: { must follow a statement`},
		{"attribute with a block", "PolicyAction a { MinRate 5 { } }\n",
			`t.pa:1:18: MinRate takes values, not a block`},
		{"nested too deep", "PolicyAction a " + strings.Repeat("{ x ", 20) + strings.Repeat("} ", 20) + "\n",
			"t.pa:1:18: unknown attribute \"x\" in PolicyAction a\nt.pa:1:80: blocks nested more than 16 deep"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParsePolicyAgent("t.pa", []byte(tt.text))
			if err == nil {
				t.Fatalf("no error, want %q", tt.want)
			}
			if err.Error() != tt.want {
				t.Errorf("error\n got: %s\nwant: %s", err, tt.want)
			}
		})
	}
}

func TestParsePolicyAgentAllErrors(t *testing.T) {
	text := `PolicyPerfMonitorForSDR enable
{
  SamplingInterval 0
  LossRatioAndWeightFr 20
}
policyAction telnetGold
{
  MinRate -5
  Colour blue
}
policyRule targetelnet
{
  ProtocolNumberRange 300
  policyactionreference telnetSilver
}
`
	_, err := ParsePolicyAgent("many.pa", []byte(text))
	want := strings.Join([]string{
		`many.pa:3:20: SamplingInterval: 0 is out of range 1..86400`,
		`many.pa:4:3: LossRatioAndWeightFr: want 2 values, got 1`,
		`many.pa:8:11: MinRate: -5 is out of range 0..9223372036854775807`,
		`many.pa:9:3: unknown attribute "Colour" in PolicyAction telnetGold`,
		`many.pa:13:23: ProtocolNumberRange: protocol 300 is out of range 0..255`,
		`many.pa:14:25: rule "targetelnet" names unknown action "telnetSilver"`,
	}, "\n")
	if err == nil || err.Error() != want {
		t.Errorf("errors\n got:\n%v\nwant:\n%s", err, want)
	}
}

// files is an in-memory file system for includes.
func files(m map[string]string) Parser {
	return Parser{ReadFile: func(name string) ([]byte, error) {
		if s, ok := m[name]; ok {
			return []byte(s), nil
		}
		return nil, errors.New("no such file")
	}}
}

func TestInclude(t *testing.T) {
	p := files(map[string]string{
		"conf/zos.pa":  seedBlock,
		"conf/bad.pa":  "PolicyAction a\n{\n  MinRate x\n}\n",
		"conf/more.pa": "PolicyRule second { PolicyActionReference local }\n",
	})
	t.Run("seed block and YAML rules share actions", func(t *testing.T) {
		c, err := p.ParseYAML("conf/main.yaml", []byte(`
include: [zos.pa, more.pa]
actions: [{name: local, minRate: 1}]
rules: [{name: first, sourcePorts: 80, action: telnetGold}]
services:
  - {name: telnet, vips: [198.18.0.23], port: 23, targets: [{address: 198.18.3.1:23}]}
`))
		if err != nil {
			t.Fatal(err)
		}
		var order []string
		for _, r := range c.Rules {
			order = append(order, r.Name+"→"+r.Action.Name)
		}
		if strings.Join(order, " ") != "first→telnetGold targetelnet→telnetGold second→local" {
			t.Errorf("rule order %v", order)
		}
		if !c.Monitor.Enabled || c.Monitor.LossMax != 95 {
			t.Errorf("monitor from include: %+v", c.Monitor)
		}
	})
	t.Run("errors name the included file", func(t *testing.T) {
		_, err := p.ParseYAML("conf/main.yaml", []byte("include: bad.pa\ninstance: {name: 5x}\nclasses: [{name: a, parent: z}]\n"))
		want := "conf/main.yaml:3:29: unknown class \"z\"\nconf/bad.pa:3:11: MinRate: want an integer, got \"x\""
		if err == nil || err.Error() != want {
			t.Errorf("errors\n got:\n%v\nwant:\n%s", err, want)
		}
	})
	t.Run("monitor in both", func(t *testing.T) {
		_, err := p.ParseYAML("conf/main.yaml", []byte("monitor: {}\ninclude: zos.pa\n"))
		want := "conf/zos.pa:1:1: monitor defined twice (first defined at conf/main.yaml:1:1)"
		if err == nil || err.Error() != want {
			t.Errorf("errors\n got:\n%v\nwant:\n%s", err, want)
		}
	})
}

func TestFormat(t *testing.T) {
	tests := []struct {
		name, data, want string
	}{
		{"a.yaml", "PolicyAction a", FormatYAML},
		{"a.yml", "", FormatYAML},
		{"a.pa", "services: []", FormatPolicyAgent},
		{"a.policy", "", FormatPolicyAgent},
		{"a.conf", "", FormatPolicyAgent},
		{"pagent", "# comment\n\n  policyaction{\n", FormatPolicyAgent},
		{"pagent", "PolicyPerfMonitorForSDR enable", FormatPolicyAgent},
		{"cfg", "# comment\nservices: []\n", FormatYAML},
		{"cfg", "{\n", FormatYAML},
		{"cfg", "", FormatYAML},
	}
	for _, tt := range tests {
		t.Run(tt.name+" "+tt.want, func(t *testing.T) {
			if got := Format(tt.name, []byte(tt.data)); got != tt.want {
				t.Errorf("Format(%q, %q) = %s, want %s", tt.name, tt.data, got, tt.want)
			}
		})
	}
}

func TestLoadErrors(t *testing.T) {
	dir := t.TempDir()
	if _, err := Load(dir + "/missing.yaml"); err == nil || !strings.Contains(err.Error(), "no such file") {
		t.Errorf("missing file: %v", err)
	}
	if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("directory: %v", err)
	}
	sniff := dir + "/pagent"
	if err := os.WriteFile(sniff, []byte(seedBlock), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := Load(sniff)
	if err != nil {
		t.Fatalf("sniffed Policy Agent file: %v", err)
	}
	checkSeed(t, c)
}
