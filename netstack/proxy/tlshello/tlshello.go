// Package tlshello reads a TLS ClientHello off a connection without
// terminating TLS, for routing by server name (SNI) as HAProxy's
// req.ssl_sni, Envoy's tls_inspector and nginx's ssl_preread do.
//
// Read flow
//
//	record header (5 bytes: type 22, version 3.x, length 1..16384)
//	    ──► its fragment (exactly length bytes) appended to the handshake buffer
//	    ──► until the buffer holds the 4-byte handshake header and the whole
//	        ClientHello it announces (one message over any number of records,
//	        each record over any number of reads)
//	    ──► Parse: the server_name extension's host_name, normalised
//
// Read consumes exactly the records that carry the ClientHello and nothing
// after them, and returns those bytes (Hello.Raw) for the caller to send on
// to the target unchanged. What it reads is bounded by max (the ClientHello
// message; the record headers add 5 bytes per record), the time by the
// caller's read deadline.
//
// The server name is the one in the ClientHello as sent: with Encrypted
// Client Hello it is the outer (public) name, the one a passthrough proxy
// can see. Plain Go: no gVisor.
package tlshello

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strings"
)

// MaxHello is the default bound on the ClientHello message (Read's max):
// a record's largest fragment, as HAProxy's default buffer and Envoy's
// tls_inspector (64 KiB there) bound theirs. Browsers send 0.5 to 2 KiB
// (a post-quantum key share, X25519MLKEM768, adds 1.2 KiB); a resumption
// ticket adds a few hundred bytes.
const MaxHello = 16384

// maxRecord is the largest TLSPlaintext fragment (RFC 8446 5.1: 2^14).
const maxRecord = 16384

// Record and handshake types read here.
const (
	recordHandshake   = 22
	typeClientHello   = 1
	extServerName     = 0
	nameTypeHostName  = 0
	recordHeaderLen   = 5
	handshakeHeadLen  = 4
	maxHostNameLength = 255
)

// Errors of Read and Parse (wrapped with details: test with errors.Is, or
// Reason for the counter name).
var (
	// ErrNotTLS: the first record is not a TLS handshake record (plain
	// text, an SSLv2 hello, another protocol).
	ErrNotTLS = errors.New("tlshello: not a TLS handshake")
	// ErrMalformed: a record or the ClientHello does not parse.
	ErrMalformed = errors.New("tlshello: malformed ClientHello")
	// ErrTooLarge: the ClientHello announces more than the bound.
	ErrTooLarge = errors.New("tlshello: ClientHello over the size bound")
)

// Reason names err for a counter: "not-tls", "malformed", "oversized",
// "timeout" (the caller's read deadline), "eof" (the client closed or reset
// before the ClientHello was complete), "error" (any other read error).
func Reason(err error) string {
	var te interface{ Timeout() bool }
	switch {
	case errors.Is(err, ErrNotTLS):
		return "not-tls"
	case errors.Is(err, ErrMalformed):
		return "malformed"
	case errors.Is(err, ErrTooLarge):
		return "oversized"
	case errors.As(err, &te) && te.Timeout():
		return "timeout"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "eof"
	}
	return "error"
}

// Reasons are every Reason of a failed Read, for counters made up front.
var Reasons = []string{"not-tls", "malformed", "oversized", "timeout", "eof", "error"}

// Hello is a ClientHello as read.
type Hello struct {
	// Raw is every byte Read consumed: the records that carried the
	// ClientHello, headers included, to be sent on unchanged.
	Raw []byte
	// Records is the number of records the message came in.
	Records int
	// ServerName is the SNI host_name, lower case, without a trailing dot;
	// "" when the ClientHello has no server_name extension.
	ServerName string
}

// Read reads one ClientHello from r: the records carrying it and no byte
// more. max bounds the message (≤ 0: MaxHello). On error the Hello holds
// what was read so far (Raw), for a caller that wants to count bytes.
func Read(r io.Reader, max int) (Hello, error) {
	if max <= 0 {
		max = MaxHello
	}
	var h Hello
	var hdr [recordHeaderLen]byte
	msg := make([]byte, 0, 512) // the handshake bytes, record headers stripped
	need := -1                  // the message's full length once known
	for need < 0 || len(msg) < need {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			if h.Records == 0 && err == io.ErrUnexpectedEOF {
				err = io.EOF
			}
			return h, fmt.Errorf("tlshello: reading record %d header: %w", h.Records+1, err)
		}
		h.Raw = append(h.Raw, hdr[:]...)
		typ, major, n := hdr[0], hdr[1], int(binary.BigEndian.Uint16(hdr[3:5]))
		if typ != recordHandshake || major != 3 {
			if h.Records == 0 {
				return h, fmt.Errorf("%w (first bytes %#x)", ErrNotTLS, hdr[:3])
			}
			return h, fmt.Errorf("%w: record %d has type %d version %#x inside the ClientHello", ErrMalformed, h.Records+1, typ, hdr[1:3])
		}
		if n == 0 || n > maxRecord {
			// RFC 8446 5.1: no zero-length handshake fragments.
			return h, fmt.Errorf("%w: record %d length %d", ErrMalformed, h.Records+1, n)
		}
		h.Records++
		// Of this record, only what the message still needs may be read
		// (need unknown: the header's 4 bytes at least); a longer record
		// would carry a second message, which a client sends only after
		// the server's answer.
		if need >= 0 && n > need-len(msg) {
			return h, fmt.Errorf("%w: record %d carries %d bytes past the ClientHello", ErrMalformed, h.Records, n-(need-len(msg)))
		}
		if len(msg)+n > max+handshakeHeadLen {
			return h, fmt.Errorf("%w: more than %d bytes", ErrTooLarge, max)
		}
		start := len(h.Raw)
		h.Raw = append(h.Raw, make([]byte, n)...)
		if _, err := io.ReadFull(r, h.Raw[start:]); err != nil {
			h.Raw = h.Raw[:start]
			return h, fmt.Errorf("tlshello: reading record %d: %w", h.Records, err)
		}
		msg = append(msg, h.Raw[start:]...)
		if need < 0 && len(msg) >= handshakeHeadLen {
			if msg[0] != typeClientHello {
				return h, fmt.Errorf("%w: handshake type %d, not ClientHello", ErrMalformed, msg[0])
			}
			body := int(msg[1])<<16 | int(msg[2])<<8 | int(msg[3])
			if body > max {
				return h, fmt.Errorf("%w: %d bytes announced, bound %d", ErrTooLarge, body, max)
			}
			need = handshakeHeadLen + body
			if len(msg) > need {
				return h, fmt.Errorf("%w: record %d carries %d bytes past the ClientHello", ErrMalformed, h.Records, len(msg)-need)
			}
		}
	}
	name, err := Parse(msg[handshakeHeadLen:])
	h.ServerName = name
	return h, err
}

// Parse returns the normalised server name of a ClientHello message body
// (after the 4-byte handshake header), "" when it has no server_name
// extension. It checks the layout of the whole message (RFC 8446 4.1.2,
// RFC 5246 7.4.1.2): every length inside its parent, no bytes left over,
// no extension twice.
func Parse(body []byte) (string, error) {
	s := reader(body)
	var vers uint16
	if !s.u16(&vers) || vers>>8 != 3 {
		return "", fmt.Errorf("%w: legacy_version", ErrMalformed)
	}
	var sid, suites, comp reader
	if !s.skip(32) || !s.vec8(&sid) || len(sid) > 32 {
		return "", fmt.Errorf("%w: random or session id", ErrMalformed)
	}
	if !s.vec16(&suites) || len(suites) < 2 || len(suites)%2 != 0 {
		return "", fmt.Errorf("%w: cipher suites", ErrMalformed)
	}
	if !s.vec8(&comp) || len(comp) < 1 {
		return "", fmt.Errorf("%w: compression methods", ErrMalformed)
	}
	if len(s) == 0 {
		return "", nil // a TLS 1.2 hello without extensions
	}
	var exts reader
	if !s.vec16(&exts) || len(s) != 0 {
		return "", fmt.Errorf("%w: extensions block", ErrMalformed)
	}
	var seen [4]uint64 // a bitset of the first 256 extension types, enough to catch most repeats cheaply
	var others []uint16
	name := ""
	for len(exts) > 0 {
		var typ uint16
		var data reader
		if !exts.u16(&typ) || !exts.vec16(&data) {
			return "", fmt.Errorf("%w: extension", ErrMalformed)
		}
		if typ < 256 {
			if seen[typ/64]&(1<<(typ%64)) != 0 {
				return "", fmt.Errorf("%w: extension %d twice", ErrMalformed, typ)
			}
			seen[typ/64] |= 1 << (typ % 64)
		} else {
			for _, o := range others {
				if o == typ {
					return "", fmt.Errorf("%w: extension %d twice", ErrMalformed, typ)
				}
			}
			others = append(others, typ)
		}
		if typ != extServerName {
			continue
		}
		n, err := parseServerName(data)
		if err != nil {
			return "", err
		}
		name = n
	}
	return name, nil
}

// parseServerName reads the server_name extension's data (RFC 6066 3):
// the list's host_name, normalised; other name types are skipped.
func parseServerName(data reader) (string, error) {
	var list reader
	if !data.vec16(&list) || len(data) != 0 || len(list) == 0 {
		return "", fmt.Errorf("%w: server_name list", ErrMalformed)
	}
	name := ""
	for len(list) > 0 {
		var typ uint8
		var n reader
		if !list.u8(&typ) || !list.vec16(&n) {
			return "", fmt.Errorf("%w: server_name entry", ErrMalformed)
		}
		if typ != nameTypeHostName {
			continue
		}
		if name != "" {
			return "", fmt.Errorf("%w: two host_names", ErrMalformed)
		}
		h, err := Normalize(string(n))
		if err != nil {
			return "", err
		}
		name = h
	}
	return name, nil
}

// Normalize returns a host name as routing compares it: lower case, one
// trailing dot dropped. It refuses an empty name, one over 255 bytes, an
// empty label, and any byte but letters, digits, '-' and '_' in a label
// (RFC 6066: "the hostname is represented as a byte string using ASCII
// encoding without a trailing dot"; '_' occurs in real names).
func Normalize(name string) (string, error) {
	name = strings.TrimSuffix(name, ".")
	if name == "" || len(name) > maxHostNameLength {
		return "", fmt.Errorf("%w: host_name of %d bytes", ErrMalformed, len(name))
	}
	lower := true
	prevDot := true // no empty first label
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case c == '.':
			if prevDot {
				return "", fmt.Errorf("%w: host_name %q has an empty label", ErrMalformed, name)
			}
			prevDot = true
			continue
		case c >= 'A' && c <= 'Z':
			lower = false
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '-', c == '_':
		default:
			return "", fmt.Errorf("%w: host_name %q has byte %#x", ErrMalformed, name, c)
		}
		prevDot = false
	}
	if !lower {
		name = strings.ToLower(name)
	}
	return name, nil
}

// reader is a cursor over a byte string, as cryptobyte.String without the
// dependency. Each method consumes on success and reports whether it had
// the bytes.
type reader []byte

func (s *reader) skip(n int) bool {
	if len(*s) < n {
		return false
	}
	*s = (*s)[n:]
	return true
}

func (s *reader) u8(v *uint8) bool {
	if len(*s) < 1 {
		return false
	}
	*v = (*s)[0]
	*s = (*s)[1:]
	return true
}

func (s *reader) u16(v *uint16) bool {
	if len(*s) < 2 {
		return false
	}
	*v = binary.BigEndian.Uint16(*s)
	*s = (*s)[2:]
	return true
}

// vec8 and vec16 read a vector with a 1- or 2-byte length prefix.
func (s *reader) vec8(out *reader) bool {
	var n uint8
	if !s.u8(&n) || len(*s) < int(n) {
		return false
	}
	*out, *s = (*s)[:n], (*s)[n:]
	return true
}

func (s *reader) vec16(out *reader) bool {
	var n uint16
	if !s.u16(&n) || len(*s) < int(n) {
		return false
	}
	*out, *s = (*s)[:n], (*s)[n:]
	return true
}
