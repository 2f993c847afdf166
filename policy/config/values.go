package config

import (
	"fmt"
	"math"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"time"

	"weir/policy"
)

// Value ranges the parsers enforce. They are documented in doc.go.
const (
	maxWeight      = 1000                    // WLM weight
	maxRatio       = 1000                    // loss and timeout thresholds, tenths of a percent
	maxFraction    = 100                     // weight fractions, percent
	maxMinSegments = 1 << 30                 // monitor.minSegments
	maxHealthRuns  = 100                     // rise and fall
	maxAttempts    = policy.MaxAttemptsLimit // the balancer's tried-set holds this many
)

// parseInt parses a decimal integer and checks lo ≤ v ≤ hi.
func parseInt(s string, lo, hi int64) (int64, error) {
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		if ne, ok := err.(*strconv.NumError); ok && ne.Err == strconv.ErrRange {
			return 0, fmt.Errorf("%s is out of range %d..%d", s, lo, hi)
		}
		return 0, fmt.Errorf("want an integer, got %q", s)
	}
	if v < lo || v > hi {
		return 0, fmt.Errorf("%s is out of range %d..%d", s, lo, hi)
	}
	return v, nil
}

// byteUnits are the suffixes ParseBytes accepts.
var byteUnits = []struct {
	suffix string
	mult   int64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30},
	{"kB", 1e3}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"B", 1},
}

// ParseBytes parses a byte count (or a rate in bytes per second): a plain
// non-negative integer or one with a suffix B, kB/KB, MB, GB (powers of
// 1000) or KiB, MiB, GiB (powers of 1024); spaces around the number and
// between it and the suffix, and _ between digits, are allowed. It is the
// one byte-size syntax of weir: the config file's and the command line's.
func ParseBytes(s string) (int64, error) {
	s = strings.TrimSpace(s)
	num, mult := s, int64(1)
	for _, u := range byteUnits {
		if strings.HasSuffix(s, u.suffix) {
			num, mult = strings.TrimSpace(strings.TrimSuffix(s, u.suffix)), u.mult
			break
		}
	}
	v, err := strconv.ParseInt(strings.ReplaceAll(num, "_", ""), 10, 64)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("want a byte count like 1000000, 1MB or 1MiB, got %q", s)
	}
	if v > math.MaxInt64/mult {
		return 0, fmt.Errorf("%s is too large", s)
	}
	return v * mult, nil
}

// parseDuration parses a Go duration ("30s", "100ms") that is ≥ 0.
func parseDuration(s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("want a duration like 30s or 100ms, got %q", s)
	}
	if d < 0 {
		return 0, fmt.Errorf("duration %s is negative", s)
	}
	return d, nil
}

// parseTOS parses a ToS byte in one of four spellings, none of which can be
// read as another: exactly eight binary digits as the Policy Agent writes it
// (10100000 = 0xA0), 0x and one or two hex digits (0xA0), 0b and one to
// eight binary digits (0b101 = 5), or 0d and a decimal 0..255 (0d160). A
// bare number that is not eight binary digits (101, 0100, 160) is an error:
// as a Policy Agent line it reads as binary, as a YAML or C literal as
// decimal or octal, and weir does not guess which was meant.
func parseTOS(s string) (uint8, error) {
	if len(s) == 8 && strings.Trim(s, "01") == "" {
		v, _ := strconv.ParseUint(s, 2, 8)
		return uint8(v), nil
	}
	base, max := 0, 0
	if len(s) > 2 && s[0] == '0' {
		switch s[1] {
		case 'x', 'X':
			base, max = 16, 2
		case 'b', 'B':
			base, max = 2, 8
		case 'd', 'D':
			base, max = 10, 3
		}
	}
	if base != 0 && len(s)-2 <= max && isDigitsIn(s[2:], base) {
		if v, err := strconv.ParseUint(s[2:], base, 8); err == nil {
			return uint8(v), nil
		}
	}
	return 0, fmt.Errorf("want a ToS byte: %s, got %q", tosForms, s)
}

// tosForms names the spellings parseTOS accepts, for its errors and docs.
const tosForms = "8 binary digits (10100000), 0x and hex (0xA0), 0b and binary (0b101) or 0d and decimal 0..255 (0d160)"

// isDigitsIn reports whether s is digits of base 2, 10 or 16 only (no sign,
// no underscore).
func isDigitsIn(s string, base int) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= '0' && c <= '1':
		case c >= '2' && c <= '9' && base >= 10:
		case (c|0x20) >= 'a' && (c|0x20) <= 'f' && base == 16:
		default:
			return false
		}
	}
	return true
}

// parseRange parses "N" or "N-M" with lo ≤ N ≤ M ≤ hi. what names the
// values in errors ("port", "protocol"), example shows a valid range.
func parseRange(s, what, example string, lo, hi int64) (a, b int64, err error) {
	first, second, isRange := strings.Cut(s, "-")
	if !isDigits(first) || (isRange && !isDigits(second)) {
		return 0, 0, fmt.Errorf("want a %s or %s range like %s, got %q", what, what, example, s)
	}
	if a, err = parseInt(first, lo, hi); err != nil {
		return 0, 0, fmt.Errorf("%s %w", what, err)
	}
	b = a
	if isRange {
		if b, err = parseInt(second, lo, hi); err != nil {
			return 0, 0, fmt.Errorf("%s %w", what, err)
		}
	}
	if b < a {
		return 0, 0, fmt.Errorf("%s range %s is reversed", what, s)
	}
	return a, b, nil
}

// isDigits reports whether s is a non-empty run of ASCII digits.
func isDigits(s string) bool {
	if s == "" || len(s) > 20 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// parsePortRange parses "80" or "8000-8010"; ports are 1..65535.
func parsePortRange(s string) (policy.PortRange, error) {
	a, b, err := parseRange(s, "port", "8000-8010", 1, 65535)
	if err != nil {
		return policy.PortRange{}, err
	}
	return policy.PortRange{Lo: uint16(a), Hi: uint16(b)}, nil
}

// parseProtoRange parses an IP protocol number range "6" or "6-17" (0..255).
func parseProtoRange(s string) (lo, hi uint8, err error) {
	a, b, err := parseRange(s, "protocol", "6-17", 0, 255)
	return uint8(a), uint8(b), err
}

// parsePrefix parses a CIDR prefix or a single address (a /32 or /128).
func parsePrefix(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return netip.Prefix{}, fmt.Errorf("want an address or a prefix like 198.18.0.0/15, got %q", s)
		}
		if p != p.Masked() {
			return netip.Prefix{}, fmt.Errorf("prefix %s has host bits set (want %s)", s, p.Masked())
		}
		return p, nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil || a.Zone() != "" {
		return netip.Prefix{}, fmt.Errorf("want an address or a prefix like 198.18.0.0/15, got %q", s)
	}
	a = a.Unmap()
	return netip.PrefixFrom(a, a.BitLen()), nil
}

// rangePrefix turns an inclusive address range lo..hi into the prefix it is
// exactly, as the Policy Agent writes SourceAddressRange lo hi.
func rangePrefix(lo, hi netip.Addr) (netip.Prefix, error) {
	lo, hi = lo.Unmap(), hi.Unmap()
	if lo.Is4() != hi.Is4() || hi.Less(lo) {
		return netip.Prefix{}, fmt.Errorf("address range %s %s is not ascending in one family", lo, hi)
	}
	for bits := 0; bits <= lo.BitLen(); bits++ {
		p := netip.PrefixFrom(lo, bits)
		if p.Masked().Addr() != lo {
			continue
		}
		if last := lastAddr(p); last == hi {
			return p, nil
		}
	}
	return netip.Prefix{}, fmt.Errorf("address range %s %s is not a prefix (weir matches prefixes)", lo, hi)
}

// lastAddr is the highest address in p.
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// parseVIP parses a virtual server address (IPv4 or IPv6, no zone).
func parseVIP(s string) (netip.Addr, error) {
	a, err := netip.ParseAddr(s)
	if err != nil || a.Zone() != "" || !a.IsValid() || a.IsUnspecified() {
		return netip.Addr{}, fmt.Errorf("want an IPv4 or IPv6 address, got %q", s)
	}
	return a.Unmap(), nil
}

// parseTargetAddr parses a target's IP:port; host names are not resolved.
//
// An address without a port (198.18.1.5, fd00::5, [fd00::5]) or with port 0
// keeps the client's port: it is returned with port 0 (policy.Target.DialAddr).
func parseTargetAddr(s string) (netip.AddrPort, error) {
	ap, err := netip.ParseAddrPort(s)
	if err != nil {
		a, aerr := netip.ParseAddr(strings.TrimSuffix(strings.TrimPrefix(s, "["), "]"))
		if aerr != nil || strings.HasPrefix(s, "[") != strings.HasSuffix(s, "]") || (strings.HasPrefix(s, "[") && !a.Is6()) {
			return netip.AddrPort{}, fmt.Errorf("want IP:port like 198.18.1.5:8080 or [fd00::5]:8080, or an IP alone to keep the client's port, got %q", s)
		}
		ap = netip.AddrPortFrom(a, 0)
	}
	if ap.Addr().Zone() != "" || ap.Addr().IsUnspecified() {
		return netip.AddrPort{}, fmt.Errorf("want IP:port like 198.18.1.5:8080 or [fd00::5]:8080, or an IP alone to keep the client's port, got %q", s)
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), nil
}

// suggest returns ` (did you mean "x"?)` when a known word is close to got.
func suggest(got string, known []string) string {
	best, bestD := "", 3
	for _, k := range known {
		d := editDistance(strings.ToLower(got), strings.ToLower(k))
		if d < bestD && d*2 <= len(got) {
			best, bestD = k, d
		}
	}
	if best == "" {
		return ""
	}
	return fmt.Sprintf(" (did you mean %q?)", best)
}

// editDistance is the Levenshtein distance, bounded in cost by the caller's
// short keywords; long inputs are cut to 64 bytes.
func editDistance(a, b string) int {
	if len(a) > 64 {
		a = a[:64]
	}
	if len(b) > 64 {
		b = b[:64]
	}
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// parseHTTPMethod accepts an HTTP method token (GET, HEAD, OPTIONS ...).
func parseHTTPMethod(s string) (string, error) {
	if s == "" || len(s) > 32 {
		return "", fmt.Errorf("want a method such as GET or HEAD, got %q", s)
	}
	for _, c := range s {
		if (c < 'A' || c > 'Z') && (c < 'a' || c > 'z') && c != '-' {
			return "", fmt.Errorf("want a method such as GET or HEAD, got %q", s)
		}
	}
	return strings.ToUpper(s), nil
}

// parseHTTPPath accepts a request path: it starts with / and holds no
// space or control character.
func parseHTTPPath(s string) (string, error) {
	if !strings.HasPrefix(s, "/") || strings.IndexFunc(s, func(c rune) bool { return c <= ' ' || c == 0x7f }) >= 0 {
		return "", fmt.Errorf("want a path starting with / without spaces, got %q", s)
	}
	return s, nil
}

// parseHTTPHost accepts a Host header value: a name or address, with an
// optional port; no space, slash or control character.
func parseHTTPHost(s string) (string, error) {
	if s == "" || strings.IndexFunc(s, func(c rune) bool { return c <= ' ' || c == 0x7f || c == '/' }) >= 0 {
		return "", fmt.Errorf("want a host name, optionally with :port, got %q", s)
	}
	return s, nil
}

// parseRegexp compiles an expect regular expression (Go RE2 syntax).
func parseRegexp(s string) (*regexp.Regexp, error) {
	re, err := regexp.Compile(s)
	if err != nil {
		return nil, fmt.Errorf("bad regular expression: %v", err)
	}
	return re, nil
}

// parseHex parses bytes given as hex digits, two per byte, upper or lower
// case; spaces, ':' and '-' may separate them ("00 01 ff", "00:01:ff").
func parseHex(s string) ([]byte, error) {
	var out []byte
	digits := 0
	var hi byte
	for i := 0; i < len(s); i++ {
		c := s[i]
		var v byte
		switch {
		case c >= '0' && c <= '9':
			v = c - '0'
		case c >= 'a' && c <= 'f':
			v = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			v = c - 'A' + 10
		case c == ' ' || c == ':' || c == '-' || c == '\t':
			if digits%2 == 1 {
				return nil, fmt.Errorf("hex %q: a lone digit before offset %d (two digits per byte)", s, i)
			}
			continue
		default:
			return nil, fmt.Errorf("hex %q: %q at offset %d is not a hex digit", s, c, i)
		}
		if digits%2 == 0 {
			hi = v
		} else {
			out = append(out, hi<<4|v)
		}
		digits++
	}
	if digits%2 == 1 {
		return nil, fmt.Errorf("hex %q: an odd number of digits (two per byte)", s)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("hex %q: no bytes", s)
	}
	return out, nil
}
