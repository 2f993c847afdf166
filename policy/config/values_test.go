package config

import (
	"net/netip"
	"strings"
	"testing"
)

func TestParseTOS(t *testing.T) {
	tests := []struct {
		in   string
		want uint8
		ok   bool
	}{
		{"10100000", 0xA0, true},
		{"00000001", 1, true},
		{"0xA0", 0xA0, true},
		{"0xa0", 0xA0, true},
		{"0x5", 5, true},
		{"0b101", 5, true},
		{"0b10100000", 0xA0, true},
		{"0d160", 160, true},
		{"0d255", 255, true},
		{"0d0", 0, true},
		{"0d256", 0, false},
		// The cases: a bare 101 was decimal 0x65 and 0100 octal
		// 0x40; neither is the Policy Agent's 8 binary digits, so neither
		// parses.
		{"101", 0, false},
		{"0100", 0, false},
		{"160", 0, false},
		{"255", 0, false},
		{"256", 0, false},
		{"1010000", 0, false},   // seven binary digits
		{"101000000", 0, false}, // nine
		{"0o240", 0, false},
		{"0x_A0", 0, false},
		{"0x", 0, false},
		{"0xA00", 0, false},
		{"0b101000001", 0, false},
		{"0d-1", 0, false},
		{"0d+1", 0, false},
		{"", 0, false},
		{"-1", 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := parseTOS(tt.in)
			if (err == nil) != tt.ok || got != tt.want {
				t.Errorf("parseTOS(%q) = %#x, %v; want %#x, ok %v", tt.in, got, err, tt.want, tt.ok)
			}
			if err != nil && !strings.Contains(err.Error(), tosForms) {
				t.Errorf("parseTOS(%q): error %q does not name the accepted forms", tt.in, err)
			}
		})
	}
}

func TestParseBytes(t *testing.T) {
	tests := []struct {
		in   string
		want int64
		ok   bool
	}{
		{"0", 0, true},
		{"1000000", 1000000, true},
		{"5B", 5, true},
		{"2kB", 2000, true},
		{"2KB", 2000, true},
		{"3MB", 3_000_000, true},
		{"1GB", 1_000_000_000, true},
		{"64KiB", 65536, true},
		{"1 MiB", 1 << 20, true},
		{"2GiB", 2 << 30, true},
		{"1_000", 1000, true},
		{" 64 MiB ", 64 << 20, true},
		{"MB", 0, false},
		{"1TB", 0, false},
		{"-1", 0, false},
		{"1.5MB", 0, false},
		{"10MiB/s", 0, false},
		{"9223372036854775807GiB", 0, false},
		{"", 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseBytes(tt.in)
			if (err == nil) != tt.ok || got != tt.want {
				t.Errorf("ParseBytes(%q) = %d, %v; want %d, ok %v", tt.in, got, err, tt.want, tt.ok)
			}
		})
	}
}

func TestRangePrefix(t *testing.T) {
	tests := []struct {
		lo, hi, want string // want "" for an error
	}{
		{"198.18.0.0", "198.19.255.255", "198.18.0.0/15"},
		{"198.18.0.7", "198.18.0.7", "198.18.0.7/32"},
		{"0.0.0.0", "255.255.255.255", "0.0.0.0/0"},
		{"fd00::", "fd00::ffff", "fd00::/112"},
		{"198.18.0.1", "198.18.0.9", ""},
		{"198.18.0.9", "198.18.0.1", ""},
		{"198.18.0.0", "fd00::", ""},
	}
	for _, tt := range tests {
		t.Run(tt.lo+"-"+tt.hi, func(t *testing.T) {
			got, err := rangePrefix(netip.MustParseAddr(tt.lo), netip.MustParseAddr(tt.hi))
			if tt.want == "" {
				if err == nil {
					t.Errorf("got %v, want an error", got)
				}
				return
			}
			if err != nil || got != netip.MustParsePrefix(tt.want) {
				t.Errorf("got %v, %v; want %s", got, err, tt.want)
			}
		})
	}
}

func TestSuggest(t *testing.T) {
	known := []string{"maxConnections", "maxBandwidth", "gold"}
	tests := []struct{ got, want string }{
		{"maxconnections", ` (did you mean "maxConnections"?)`},
		{"maxBandwith", ` (did you mean "maxBandwidth"?)`},
		{"glod", ` (did you mean "gold"?)`},
		{"zz", ""},
		{"colour", ""},
	}
	for _, tt := range tests {
		if got := suggest(tt.got, known); got != tt.want {
			t.Errorf("suggest(%q) = %q, want %q", tt.got, got, tt.want)
		}
	}
}
