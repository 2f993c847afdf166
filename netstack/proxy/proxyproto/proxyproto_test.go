package proxyproto

import (
	"bytes"
	"encoding/hex"
	"errors"
	"io"
	"net/netip"
	"strings"
	"testing"
)

func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

// ffff6 is the spec's widest IPv6 address, for its worst-case lines.
const ffff6 = "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"

func unhex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.ReplaceAll(s, " ", ""))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestReadSpec reads the headers of doc/proxy-protocol.txt's examples (the
// v1 lines of section 2.1, the worst cases included) and a v2 header as
// HAProxy's send-proxy-v2 wrote it (captured), each followed by payload
// that Read must leave unread.
func TestReadSpec(t *testing.T) {
	tests := []struct {
		name   string
		in     []byte
		accept Version
		want   Header
	}{
		{"v1 TCP4 (spec 2.1)", []byte("PROXY TCP4 192.168.0.1 192.168.0.11 56324 443\r\n"), V1,
			Header{Version: V1, Src: ap("192.168.0.1:56324"), Dst: ap("192.168.0.11:443")}},
		{"v1 TCP6 worst case, 104 bytes", []byte("PROXY TCP6 " + ffff6 + " " + ffff6 + " 65535 65535\r\n"), Any,
			Header{Version: V1, Src: ap("[" + ffff6 + "]:65535"), Dst: ap("[" + ffff6 + "]:65535")}},
		{"v1 UNKNOWN", []byte("PROXY UNKNOWN\r\n"), V1, Header{Version: V1, Local: true}},
		{"v1 UNKNOWN worst case, 107 bytes", []byte("PROXY UNKNOWN " + ffff6 + " " + ffff6 + " 65535 65535\r\n"), Any,
			Header{Version: V1, Local: true}},
		{"v2 TCP4 from HAProxy send-proxy-v2", unhex(t, "0d0a0d0a000d0a515549540a 21 11 000c ac130001 ac130003 a652 0050"), V2,
			Header{Version: V2, Src: ap("172.19.0.1:42578"), Dst: ap("172.19.0.3:80")}},
		{"v2 TCP6", unhex(t, "0d0a0d0a000d0a515549540a 21 21 0024 fd000000000000000000000000000001 fd000000000000000000000000000002 3039 01bb"), Any,
			Header{Version: V2, Src: ap("[fd00::1]:12345"), Dst: ap("[fd00::2]:443")}},
		{"v2 TCP4 with TLVs (ALPN, NOOP)", unhex(t, "0d0a0d0a000d0a515549540a 21 11 0017 c6120501 c6120001 1f90 0050 01 0002 6832 04 0003 000000"), V2,
			Header{Version: V2, Src: ap("198.18.5.1:8080"), Dst: ap("198.18.0.1:80")}},
		{"v2 LOCAL (health check)", unhex(t, "0d0a0d0a000d0a515549540a 20 00 0000"), V2, Header{Version: V2, Local: true}},
		{"v2 LOCAL with addresses ignored", unhex(t, "0d0a0d0a000d0a515549540a 20 11 000c 01020304 05060708 0001 0002"), V2, Header{Version: V2, Local: true}},
		{"v2 PROXY UNSPEC", unhex(t, "0d0a0d0a000d0a515549540a 21 00 0000"), V2, Header{Version: V2, Local: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := bytes.NewReader(append(append([]byte(nil), tt.in...), "GET / HTTP/1.1\r\n"...))
			h, err := Read(r, tt.accept)
			if err != nil {
				t.Fatalf("Read: %v", err)
			}
			if h != tt.want {
				t.Fatalf("Read = %+v, want %+v", h, tt.want)
			}
			rest, _ := io.ReadAll(r)
			if string(rest) != "GET / HTTP/1.1\r\n" {
				t.Fatalf("payload after the header = %q: Read consumed too much or too little", rest)
			}
		})
	}
}

// TestReadRefuses checks each malformed or unwanted header is refused with
// the right reason, and never reads past the header's bound.
func TestReadRefuses(t *testing.T) {
	long := "PROXY UNKNOWN " + strings.Repeat("x", 100) + "\r\n"
	tests := []struct {
		name   string
		in     string
		accept Version
		reason string
	}{
		{"plain http", "GET / HTTP/1.1\r\nHost: x\r\n\r\n", Any, "missing"},
		{"v1 when v2 wanted", "PROXY TCP4 1.2.3.4 5.6.7.8 1 2\r\n", V2, "missing"},
		{"v2 when v1 wanted", "\r\n\r\n\x00\r\nQUIT\n\x21\x11\x00\x0c", V1, "missing"},
		{"bad v2 signature", "\r\n\r\n\x00\r\nQUIX\n\x21\x11\x00\x0c", V2, "missing"},
		{"closed before the header", "PROX", Any, "missing"},
		{"v1 cut before CRLF", "PROXY TCP4 1.2.3.4", Any, "missing"},
		{"v1 over 107 bytes", long, V1, "malformed"},
		{"v1 LF without CR", "PROXY TCP4 1.2.3.4 5.6.7.8 1 2\n", V1, "malformed"},
		{"v1 TCP5", "PROXY TCP5 1.2.3.4 5.6.7.8 1 2\r\n", V1, "malformed"},
		{"v1 TCP4 with IPv6", "PROXY TCP4 ::1 ::2 1 2\r\n", V1, "malformed"},
		{"v1 TCP6 with IPv4", "PROXY TCP6 1.2.3.4 5.6.7.8 1 2\r\n", V1, "malformed"},
		{"v1 port too big", "PROXY TCP4 1.2.3.4 5.6.7.8 65536 2\r\n", V1, "malformed"},
		{"v1 port leading zero", "PROXY TCP4 1.2.3.4 5.6.7.8 01 2\r\n", V1, "malformed"},
		{"v1 port sign", "PROXY TCP4 1.2.3.4 5.6.7.8 +1 2\r\n", V1, "malformed"},
		{"v1 missing field", "PROXY TCP4 1.2.3.4 5.6.7.8 1\r\n", V1, "malformed"},
		{"v1 extra field", "PROXY TCP4 1.2.3.4 5.6.7.8 1 2 3\r\n", V1, "malformed"},
		{"v1 double space", "PROXY TCP4  1.2.3.4 5.6.7.8 1 2\r\n", V1, "malformed"},
		{"v1 zone", "PROXY TCP6 fe80::1%eth0 fe80::2 1 2\r\n", V1, "malformed"},
		{"v2 version 1", "\r\n\r\n\x00\r\nQUIT\n\x11\x11\x00\x0c" + strings.Repeat("\x00", 12), V2, "malformed"},
		{"v2 command 2", "\r\n\r\n\x00\r\nQUIT\n\x22\x11\x00\x0c" + strings.Repeat("\x00", 12), V2, "malformed"},
		{"v2 INET too short", "\r\n\r\n\x00\r\nQUIT\n\x21\x11\x00\x08" + strings.Repeat("\x00", 8), V2, "malformed"},
		{"v2 INET6 too short", "\r\n\r\n\x00\r\nQUIT\n\x21\x21\x00\x0c" + strings.Repeat("\x00", 12), V2, "malformed"},
		{"v2 DGRAM", "\r\n\r\n\x00\r\nQUIT\n\x21\x12\x00\x0c" + strings.Repeat("\x00", 12), V2, "malformed"},
		{"v2 family 4", "\r\n\r\n\x00\r\nQUIT\n\x21\x41\x00\x0c" + strings.Repeat("\x00", 12), V2, "malformed"},
		{"v2 length over the bound", "\r\n\r\n\x00\r\nQUIT\n\x21\x11\xff\xff", V2, "malformed"},
		{"v2 TLV past the end", "\r\n\r\n\x00\r\nQUIT\n\x21\x11\x00\x0f" + strings.Repeat("\x00", 12) + "\x01\x00\x05", V2, "malformed"},
		{"v2 TLV cut", "\r\n\r\n\x00\r\nQUIT\n\x21\x11\x00\x0e" + strings.Repeat("\x00", 12) + "\x01\x00", V2, "malformed"},
		{"v2 payload cut", "\r\n\r\n\x00\r\nQUIT\n\x21\x11\x00\x0c\x01\x02", V2, "missing"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &countingReader{r: strings.NewReader(tt.in + "PAYLOAD")}
			_, err := Read(r, tt.accept)
			if err == nil {
				t.Fatalf("Read(%q) accepted it", tt.in)
			}
			if got := Reason(err); got != tt.reason {
				t.Fatalf("Reason(%v) = %q, want %q", err, got, tt.reason)
			}
			if r.n > 16+MaxV2Payload {
				t.Fatalf("read %d bytes, over the bound", r.n)
			}
		})
	}
}

type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

type timeoutErr struct{}

func (timeoutErr) Error() string { return "i/o timeout" }
func (timeoutErr) Timeout() bool { return true }

type timeoutReader struct{}

func (timeoutReader) Read([]byte) (int, error) { return 0, timeoutErr{} }

func TestReasonTimeout(t *testing.T) {
	_, err := Read(timeoutReader{}, Any)
	if Reason(err) != "timeout" {
		t.Fatalf("Reason(%v) = %q, want timeout", err, Reason(err))
	}
	if Reason(errors.New("x")) != "error" {
		t.Fatal("an unknown error is not \"error\"")
	}
}

// TestAppend checks the writer against the spec's byte layouts and that the
// reader reads back what it wrote.
func TestAppend(t *testing.T) {
	tests := []struct {
		name     string
		v        Version
		src, dst netip.AddrPort
		want     []byte
		back     Header
	}{
		{"v1 TCP4", V1, ap("192.168.0.1:56324"), ap("192.168.0.11:443"),
			[]byte("PROXY TCP4 192.168.0.1 192.168.0.11 56324 443\r\n"),
			Header{Version: V1, Src: ap("192.168.0.1:56324"), Dst: ap("192.168.0.11:443")}},
		{"v1 TCP4 from mapped", V1, ap("[::ffff:198.18.5.1]:1000"), ap("198.18.0.1:80"),
			[]byte("PROXY TCP4 198.18.5.1 198.18.0.1 1000 80\r\n"),
			Header{Version: V1, Src: ap("198.18.5.1:1000"), Dst: ap("198.18.0.1:80")}},
		{"v1 TCP6", V1, ap("[fd00::5]:40000"), ap("[fd00::1]:443"),
			[]byte("PROXY TCP6 fd00::5 fd00::1 40000 443\r\n"),
			Header{Version: V1, Src: ap("[fd00::5]:40000"), Dst: ap("[fd00::1]:443")}},
		{"v1 mixed families go TCP6", V1, ap("198.18.5.1:1000"), ap("[fd00::1]:443"),
			[]byte("PROXY TCP6 ::ffff:198.18.5.1 fd00::1 1000 443\r\n"),
			Header{Version: V1, Src: ap("[::ffff:198.18.5.1]:1000"), Dst: ap("[fd00::1]:443")}},
		{"v1 UNKNOWN", V1, netip.AddrPort{}, netip.AddrPort{}, []byte("PROXY UNKNOWN\r\n"), Header{Version: V1, Local: true}},
		{"v2 TCP4", V2, ap("172.19.0.1:42578"), ap("172.19.0.3:80"),
			unhex(t, "0d0a0d0a000d0a515549540a 21 11 000c ac130001 ac130003 a652 0050"),
			Header{Version: V2, Src: ap("172.19.0.1:42578"), Dst: ap("172.19.0.3:80")}},
		{"v2 TCP6", V2, ap("[fd00::1]:12345"), ap("[fd00::2]:443"),
			unhex(t, "0d0a0d0a000d0a515549540a 21 21 0024 fd000000000000000000000000000001 fd000000000000000000000000000002 3039 01bb"),
			Header{Version: V2, Src: ap("[fd00::1]:12345"), Dst: ap("[fd00::2]:443")}},
		{"v2 LOCAL", V2, netip.AddrPort{}, netip.AddrPort{}, unhex(t, "0d0a0d0a000d0a515549540a 20 00 0000"), Header{Version: V2, Local: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Append(nil, tt.v, tt.src, tt.dst)
			if !bytes.Equal(got, tt.want) {
				t.Fatalf("Append = %q, want %q", got, tt.want)
			}
			h, err := Read(bytes.NewReader(got), tt.v)
			if err != nil || h != tt.back {
				t.Fatalf("Read(Append) = %+v, %v; want %+v", h, err, tt.back)
			}
		})
	}
}

func TestAppendAllocs(t *testing.T) {
	buf := make([]byte, 0, 64)
	src, dst := ap("[fd00::5]:40000"), ap("[fd00::1]:443")
	if n := testing.AllocsPerRun(100, func() { buf = AppendV1(buf[:0], src, dst); buf = AppendV2(buf[:0], src, dst) }); n != 0 {
		t.Fatalf("Append allocates %v times", n)
	}
}
