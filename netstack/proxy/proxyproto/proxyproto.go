// Package proxyproto reads and writes the PROXY protocol header, versions 1
// (text) and 2 (binary), as HAProxy's doc/proxy-protocol.txt specifies it:
// the line or block a proxy sends first on a connection to say whose
// connection it relays (the client's address and port, and the address and
// port the client connected to).
//
// Read consumes exactly the header's bytes and nothing after it, so the
// caller goes on reading the connection's payload from the same reader; it
// bounds what it reads (a v1 line at most MaxV1Len bytes, a v2 block at
// most 16+MaxV2Payload) and leaves the time bound to the caller's read
// deadline. AppendV1 and AppendV2 write a header for a TCP connection (TCP4
// or TCP6) or, with no addresses, the header of a connection the sender
// makes itself (v1 UNKNOWN, v2 LOCAL), which is what a health check sends.
//
// Plain Go: no gVisor, no allocation beyond the returned header.
package proxyproto

//go:generate go run golang.org/x/tools/cmd/stringer@v0.52.0 -type=Version -linecomment -output=version_string.go
import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strconv"
)

// Version is a PROXY protocol version, or a set of them for Read.
type Version uint8

// The versions; Any is the set of both, for Read.
const (
	V1  Version = 1       // v1
	V2  Version = 2       // v2
	Any Version = V1 | V2 // any
)

// Bounds of what Read reads.
const (
	// MaxV1Len is the longest v1 line, CRLF included (the spec's 107).
	MaxV1Len = 107
	// MaxV2Payload bounds the length field of a v2 header: the addresses
	// (at most 216 bytes, AF_UNIX) and the TLVs a load balancer adds (AWS,
	// GCP and Azure add tens of bytes). The spec allows 65535; a longer
	// header is refused as malformed rather than read.
	MaxV2Payload = 1024
)

// v2Sig is the 12-byte signature that opens a v2 header.
var v2Sig = [12]byte{0x0D, 0x0A, 0x0D, 0x0A, 0x00, 0x0D, 0x0A, 0x51, 0x55, 0x49, 0x54, 0x0A}

// v1Prefix opens a v1 header.
const v1Prefix = "PROXY "

// Header is one PROXY protocol header.
type Header struct {
	// Version is the header's version (V1 or V2).
	Version Version
	// Local is set when the header carries no addresses: a v2 LOCAL
	// command, a v2 PROXY with an unspecified (or AF_UNIX) family, a v1
	// UNKNOWN. The receiver then uses the connection's own addresses.
	Local bool
	// Src is the client's address and port, Dst the address and port it
	// connected to; both valid unless Local.
	Src, Dst netip.AddrPort
}

// Errors Read returns (wrapped with details; test with errors.Is).
var (
	// ErrMissing: the connection's first bytes are no header of an
	// accepted version (a client speaking directly, or an outer proxy
	// configured for the other version).
	ErrMissing = errors.New("proxyproto: no PROXY protocol header")
	// ErrMalformed: a header that does not follow the spec, or one longer
	// than the bounds.
	ErrMalformed = errors.New("proxyproto: malformed PROXY protocol header")
)

func malformed(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrMalformed, fmt.Sprintf(format, args...))
}

// Read reads one header of a version in accept from r, consuming exactly
// its bytes. It fails with ErrMissing when the first bytes are no accepted
// header, ErrMalformed when the header is wrong, or r's error (io.EOF,
// io.ErrUnexpectedEOF, a deadline) when the bytes stop coming.
func Read(r io.Reader, accept Version) (Header, error) {
	if accept&Any == 0 {
		return Header{}, fmt.Errorf("proxyproto: Read: no version accepted")
	}
	// Both signatures are told apart by their first byte: 'P' for v1,
	// CR for v2. Reading 6 bytes (v1's "PROXY ") never reads past a
	// header: the shortest one is v1's "PROXY UNKNOWN\r\n", 15 bytes.
	var b [16]byte
	if _, err := io.ReadFull(r, b[:len(v1Prefix)]); err != nil {
		return Header{}, err
	}
	switch {
	case accept&V1 != 0 && string(b[:len(v1Prefix)]) == v1Prefix:
		return readV1(r)
	case accept&V2 != 0 && [6]byte(b[:6]) == [6]byte(v2Sig[:6]):
		if _, err := io.ReadFull(r, b[6:]); err != nil {
			return Header{}, err
		}
		if [12]byte(b[:12]) != v2Sig {
			return Header{}, fmt.Errorf("%w: bad v2 signature", ErrMissing)
		}
		return readV2(r, b)
	}
	return Header{}, fmt.Errorf("%w (want %v, got %q)", ErrMissing, accept, b[:len(v1Prefix)])
}

// readV1 reads the rest of a v1 line, after "PROXY ", a byte at a time so
// as not to read past its LF.
func readV1(r io.Reader) (Header, error) {
	var line [MaxV1Len]byte
	n := copy(line[:], v1Prefix)
	for {
		if n == len(line) {
			return Header{}, malformed("v1 line longer than %d bytes", MaxV1Len)
		}
		if _, err := io.ReadFull(r, line[n:n+1]); err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return Header{}, err
		}
		n++
		if line[n-1] == '\n' {
			break
		}
	}
	return ParseV1(line[:n])
}

// ParseV1 parses one complete v1 line, "PROXY " to CRLF.
func ParseV1(line []byte) (Header, error) {
	h := Header{Version: V1}
	if len(line) > MaxV1Len {
		return h, malformed("v1 line longer than %d bytes", MaxV1Len)
	}
	if len(line) < len(v1Prefix)+2 || string(line[:len(v1Prefix)]) != v1Prefix {
		return h, ErrMissing
	}
	if line[len(line)-2] != '\r' || line[len(line)-1] != '\n' {
		return h, malformed("v1 line does not end in CRLF")
	}
	rest := line[len(v1Prefix) : len(line)-2]
	var f [5][]byte
	nf := 0
	for len(rest) > 0 && nf < len(f) {
		i := 0
		for i < len(rest) && rest[i] != ' ' {
			i++
		}
		f[nf], nf = rest[:i], nf+1
		if i == len(rest) {
			rest = nil
			break
		}
		rest = rest[i+1:]
		if len(rest) == 0 {
			return h, malformed("v1 line ends in a space")
		}
	}
	if nf == 0 {
		return h, malformed("v1 line has no protocol")
	}
	proto := string(f[0])
	if proto == "UNKNOWN" {
		// The spec: the receiver ignores whatever follows UNKNOWN.
		h.Local = true
		return h, nil
	}
	if proto != "TCP4" && proto != "TCP6" {
		return h, malformed("v1 protocol %q, want TCP4, TCP6 or UNKNOWN", f[0])
	}
	if nf != 5 || len(rest) != 0 {
		return h, malformed("v1 %s line wants 4 fields after the protocol", proto)
	}
	var addr [2]netip.Addr
	for i := range addr {
		a, err := netip.ParseAddr(string(f[1+i]))
		if err != nil || a.Zone() != "" || (proto == "TCP4") != a.Is4() {
			return h, malformed("v1 %s address %q", proto, f[1+i])
		}
		addr[i] = a
	}
	var port [2]uint16
	for i := range port {
		p, ok := parsePort(f[3+i])
		if !ok {
			return h, malformed("v1 port %q", f[3+i])
		}
		port[i] = p
	}
	h.Src = netip.AddrPortFrom(addr[0], port[0])
	h.Dst = netip.AddrPortFrom(addr[1], port[1])
	return h, nil
}

// parsePort parses a decimal port without sign or leading zeros.
func parsePort(b []byte) (uint16, bool) {
	if len(b) == 0 || len(b) > 5 || (b[0] == '0' && len(b) > 1) {
		return 0, false
	}
	v := 0
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		v = v*10 + int(c-'0')
	}
	return uint16(v), v <= 65535
}

// v2 header fields.
const (
	v2Version   = 0x20
	cmdLocal    = 0x0
	cmdProxy    = 0x1
	famUnspec   = 0x0
	famInet     = 0x1
	famInet6    = 0x2
	famUnix     = 0x3
	protoUnspec = 0x0
	protoStream = 0x1
)

// readV2 reads a v2 header's address block and TLVs; hdr holds its first
// 16 bytes.
func readV2(r io.Reader, hdr [16]byte) (Header, error) {
	h := Header{Version: V2}
	if hdr[12]&0xF0 != v2Version {
		return h, malformed("v2 version nibble %#x", hdr[12]>>4)
	}
	n := int(binary.BigEndian.Uint16(hdr[14:16]))
	if n > MaxV2Payload {
		return h, malformed("v2 length %d over %d", n, MaxV2Payload)
	}
	// What a header must hold is checked before its payload is read, so a
	// malformed one is refused without waiting for bytes.
	if err := checkV2(hdr, n); err != nil {
		return h, err
	}
	var buf [MaxV2Payload]byte
	if _, err := io.ReadFull(r, buf[:n]); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return h, err
	}
	return ParseV2(append(hdr[:], buf[:n]...))
}

// checkV2 checks a v2 header's fixed part against its payload length n.
func checkV2(hdr [16]byte, n int) error {
	cmd, fam, proto := hdr[12]&0x0F, hdr[13]>>4, hdr[13]&0x0F
	switch cmd {
	case cmdLocal:
		return nil // addresses, if any, are ignored
	case cmdProxy:
	default:
		return malformed("v2 command %#x", cmd)
	}
	if fam == famUnspec || fam == famUnix {
		return nil // no address weir can use: the connection's own
	}
	if proto != protoStream {
		return malformed("v2 transport %#x, want STREAM", proto)
	}
	need := 0
	switch fam {
	case famInet:
		need = 12
	case famInet6:
		need = 36
	default:
		return malformed("v2 family %#x", fam)
	}
	if n < need {
		return malformed("v2 length %d too short for its family (%d)", n, need)
	}
	return nil
}

// ParseV2 parses one complete v2 header: the 16 fixed bytes and exactly
// the payload its length field gives.
func ParseV2(b []byte) (Header, error) {
	h := Header{Version: V2}
	if len(b) < 16 || [12]byte(b[:12]) != v2Sig {
		return h, ErrMissing
	}
	if b[12]&0xF0 != v2Version {
		return h, malformed("v2 version nibble %#x", b[12]>>4)
	}
	n := int(binary.BigEndian.Uint16(b[14:16]))
	if n > MaxV2Payload || len(b) != 16+n {
		return h, malformed("v2 length %d for %d bytes", n, len(b)-16)
	}
	if err := checkV2([16]byte(b[:16]), n); err != nil {
		return h, err
	}
	cmd, fam := b[12]&0x0F, b[13]>>4
	p := b[16:]
	var tlvAt int
	switch {
	case cmd == cmdLocal || fam == famUnspec || fam == famUnix:
		h.Local = true
		return h, nil // TLVs of an address-less header are not looked at
	case fam == famInet:
		h.Src = netip.AddrPortFrom(netip.AddrFrom4([4]byte(p[0:4])), binary.BigEndian.Uint16(p[8:10]))
		h.Dst = netip.AddrPortFrom(netip.AddrFrom4([4]byte(p[4:8])), binary.BigEndian.Uint16(p[10:12]))
		tlvAt = 12
	default: // famInet6
		h.Src = netip.AddrPortFrom(netip.AddrFrom16([16]byte(p[0:16])), binary.BigEndian.Uint16(p[32:34]))
		h.Dst = netip.AddrPortFrom(netip.AddrFrom16([16]byte(p[16:32])), binary.BigEndian.Uint16(p[34:36]))
		tlvAt = 36
	}
	// The TLVs must tile the rest exactly (type, 2-byte length, value);
	// their contents are not used.
	for t := p[tlvAt:]; len(t) > 0; {
		if len(t) < 3 {
			return h, malformed("v2 TLV cut short")
		}
		l := int(binary.BigEndian.Uint16(t[1:3]))
		if len(t) < 3+l {
			return h, malformed("v2 TLV %#x of length %d past the header", t[0], l)
		}
		t = t[3+l:]
	}
	return h, nil
}

// family returns the two addresses in one family: both IPv4 (unmapped)
// when both are, else both IPv6 (an IPv4 one mapped). ok is false when
// either is invalid.
func family(src, dst netip.AddrPort) (s, d netip.AddrPort, v4, ok bool) {
	if !src.IsValid() || !dst.IsValid() {
		return src, dst, false, false
	}
	sa, da := src.Addr().Unmap(), dst.Addr().Unmap()
	if sa.Is4() && da.Is4() {
		return netip.AddrPortFrom(sa, src.Port()), netip.AddrPortFrom(da, dst.Port()), true, true
	}
	if sa.Is4() {
		sa = netip.AddrFrom16(sa.As16())
	}
	if da.Is4() {
		da = netip.AddrFrom16(da.As16())
	}
	return netip.AddrPortFrom(sa.WithZone(""), src.Port()), netip.AddrPortFrom(da.WithZone(""), dst.Port()), false, true
}

// AppendV1 appends the v1 line for a TCP connection from src to dst: TCP4
// when both are IPv4, TCP6 otherwise (an IPv4 address mapped), UNKNOWN
// when either is invalid (a connection the sender makes itself).
func AppendV1(b []byte, src, dst netip.AddrPort) []byte {
	s, d, v4, ok := family(src, dst)
	if !ok {
		return append(b, "PROXY UNKNOWN\r\n"...)
	}
	b = append(b, v1Prefix...)
	if v4 {
		b = append(b, "TCP4 "...)
	} else {
		b = append(b, "TCP6 "...)
	}
	b = s.Addr().AppendTo(b)
	b = append(b, ' ')
	b = d.Addr().AppendTo(b)
	b = append(b, ' ')
	b = strconv.AppendUint(b, uint64(s.Port()), 10)
	b = append(b, ' ')
	b = strconv.AppendUint(b, uint64(d.Port()), 10)
	return append(b, '\r', '\n')
}

// AppendV2 appends the v2 header for a TCP connection from src to dst
// (PROXY, INET or INET6 over STREAM), or, when either is invalid, a LOCAL
// header with no addresses.
func AppendV2(b []byte, src, dst netip.AddrPort) []byte {
	b = append(b, v2Sig[:]...)
	s, d, v4, ok := family(src, dst)
	switch {
	case !ok:
		return append(b, v2Version|cmdLocal, famUnspec<<4|protoUnspec, 0, 0)
	case v4:
		b = append(b, v2Version|cmdProxy, famInet<<4|protoStream, 0, 12)
		sa, da := s.Addr().As4(), d.Addr().As4()
		b = append(b, sa[:]...)
		b = append(b, da[:]...)
	default:
		b = append(b, v2Version|cmdProxy, famInet6<<4|protoStream, 0, 36)
		sa, da := s.Addr().As16(), d.Addr().As16()
		b = append(b, sa[:]...)
		b = append(b, da[:]...)
	}
	b = binary.BigEndian.AppendUint16(b, s.Port())
	return binary.BigEndian.AppendUint16(b, d.Port())
}

// Append appends the header of version v (V1 or V2) for a connection from
// src to dst; invalid addresses make the address-less header (v1 UNKNOWN,
// v2 LOCAL).
func Append(b []byte, v Version, src, dst netip.AddrPort) []byte {
	if v == V1 {
		return AppendV1(b, src, dst)
	}
	return AppendV2(b, src, dst)
}

// Reason names the kind of a Read error for a counter: "missing" (no
// header, or the connection closed before one), "malformed", "timeout"
// (the reader's deadline passed) or "error".
func Reason(err error) string {
	var te interface{ Timeout() bool }
	switch {
	case errors.Is(err, ErrMalformed):
		return "malformed"
	case errors.Is(err, ErrMissing), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "missing"
	case errors.As(err, &te) && te.Timeout():
		return "timeout"
	}
	return "error"
}
