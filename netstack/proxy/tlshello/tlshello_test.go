package tlshello

import (
	"bytes"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"testing/iotest"
	"time"
)

// goHello returns the ClientHello Go's crypto/tls client sends for
// serverName ("" for none, as for an IP address), as the records it wrote,
// read off a pipe by Read itself.
func goHello(t testing.TB, serverName string) []byte {
	t.Helper()
	c, s := net.Pipe()
	defer s.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		cfg := &tls.Config{ServerName: serverName, InsecureSkipVerify: true}
		if serverName == "" {
			cfg.ServerName = "198.18.0.1" // an IP address: Go sends no SNI
		}
		_ = tls.Client(c, cfg).Handshake()
	}()
	_ = s.SetReadDeadline(time.Now().Add(10 * time.Second))
	h, err := Read(s, 0)
	if err != nil {
		t.Fatalf("reading Go's ClientHello: %v", err)
	}
	c.Close()
	<-done
	return h.Raw
}

// message strips the record headers off records: the handshake bytes.
func message(t testing.TB, records []byte) []byte {
	t.Helper()
	var msg []byte
	for len(records) > 0 {
		if len(records) < 5 {
			t.Fatalf("short record header")
		}
		n := int(binary.BigEndian.Uint16(records[3:5]))
		msg = append(msg, records[5:5+n]...)
		records = records[5+n:]
	}
	return msg
}

// records frames msg in handshake records of at most size bytes each.
func records(msg []byte, size int) []byte {
	var out []byte
	for len(msg) > 0 {
		n := min(size, len(msg))
		out = append(out, recordHandshake, 3, 1, byte(n>>8), byte(n))
		out = append(out, msg[:n]...)
		msg = msg[n:]
	}
	return out
}

// hello builds a ClientHello message (handshake header included) with the
// given extensions block contents (nil: no extensions block at all).
func hello(exts []byte) []byte {
	var b []byte
	b = append(b, 3, 3)                // legacy_version
	b = append(b, make([]byte, 32)...) // random
	b = append(b, 0)                   // session id
	b = append(b, 0, 2, 0x13, 0x01)    // one cipher suite
	b = append(b, 1, 0)                // null compression
	if exts != nil {
		b = binary.BigEndian.AppendUint16(b, uint16(len(exts)))
		b = append(b, exts...)
	}
	return append([]byte{typeClientHello, byte(len(b) >> 16), byte(len(b) >> 8), byte(len(b))}, b...)
}

// sniExt is a server_name extension with one host_name.
func sniExt(name string) []byte {
	entry := append([]byte{nameTypeHostName}, binary.BigEndian.AppendUint16(nil, uint16(len(name)))...)
	entry = append(entry, name...)
	list := binary.BigEndian.AppendUint16(nil, uint16(len(entry)))
	list = append(list, entry...)
	ext := binary.BigEndian.AppendUint16(nil, extServerName)
	ext = binary.BigEndian.AppendUint16(ext, uint16(len(list)))
	return append(ext, list...)
}

func TestGoClientHello(t *testing.T) {
	raw := goHello(t, "Www.Example.COM")
	h, err := Read(bytes.NewReader(raw), 0)
	if err != nil || h.ServerName != "www.example.com" || h.Records != 1 || !bytes.Equal(h.Raw, raw) {
		t.Fatalf("Read = %q, %d records, %d of %d bytes, %v", h.ServerName, h.Records, len(h.Raw), len(raw), err)
	}
	// Go's client never sends ECH unless configured: the name is the real one.
	if bytes.Contains(raw, []byte{0xfe, 0x0d}) && strings.Contains(string(raw), "example") {
		t.Logf("hello carries an ECH-like byte pair (harmless)")
	}
	t.Logf("Go's ClientHello: %d bytes", len(raw))
}

func TestNoSNI(t *testing.T) {
	raw := goHello(t, "")
	h, err := Read(bytes.NewReader(raw), 0)
	if err != nil || h.ServerName != "" {
		t.Fatalf("Read = %q, %v; want no name", h.ServerName, err)
	}
	// A TLS 1.2-style hello without any extensions block.
	h, err = Read(bytes.NewReader(records(hello(nil), 1000)), 0)
	if err != nil || h.ServerName != "" {
		t.Fatalf("no extensions: %q, %v", h.ServerName, err)
	}
}

// TestFragmented: the message over records of every small size, and each
// framing fed a byte per read (segments of one byte), reads the same name
// and consumes exactly the records, leaving what follows.
func TestFragmented(t *testing.T) {
	msg := message(t, goHello(t, "a.example.net"))
	for _, size := range []int{1, 2, 3, 4, 5, 7, 64, 500, len(msg) - 1, len(msg)} {
		rec := records(msg, size)
		for _, oneByte := range []bool{false, true} {
			in := append(append([]byte(nil), rec...), "after"...)
			var r io.Reader = bytes.NewReader(in)
			if oneByte {
				r = iotest.OneByteReader(r)
			}
			h, err := Read(r, 0)
			if err != nil || h.ServerName != "a.example.net" || !bytes.Equal(h.Raw, rec) {
				t.Fatalf("records of %d (one byte a read: %v): %q, %d records, %v", size, oneByte, h.ServerName, h.Records, err)
			}
			if want := (len(msg) + size - 1) / size; h.Records != want {
				t.Fatalf("records of %d: %d records, want %d", size, h.Records, want)
			}
			rest, _ := io.ReadAll(r)
			if string(rest) != "after" {
				t.Fatalf("records of %d: left %q, want \"after\"", size, rest)
			}
		}
	}
}

func TestServerNameNormalised(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"example.com", "example.com"},
		{"EXAMPLE.com.", "example.com"},
		{"Foo-Bar_1.Example.Org", "foo-bar_1.example.org"},
		{"localhost", "localhost"},
	} {
		h, err := Read(bytes.NewReader(records(hello(sniExt(tc.in)), 16384)), 0)
		if err != nil || h.ServerName != tc.want {
			t.Errorf("%q: %q, %v; want %q", tc.in, h.ServerName, err, tc.want)
		}
	}
	for _, bad := range []string{"", ".", "a..b", ".a", "exa mple.com", "a\x00b", "é.com", strings.Repeat("a", 256)} {
		_, err := Read(bytes.NewReader(records(hello(sniExt(bad)), 16384)), 0)
		if !errors.Is(err, ErrMalformed) {
			t.Errorf("%q: %v, want malformed", bad, err)
		}
	}
}

func TestOversized(t *testing.T) {
	// Announces 20 000 bytes: refused after the first record, not read whole.
	msg := hello(sniExt("big.example"))
	msg[1], msg[2], msg[3] = 0, 20000>>8, 20000&0xff
	r := bytes.NewReader(append(records(msg, 16384), make([]byte, 20000)...))
	_, err := Read(r, 0)
	if !errors.Is(err, ErrTooLarge) || Reason(err) != "oversized" {
		t.Fatalf("20000 announced: %v", err)
	}
	// A real hello over a small bound.
	raw := goHello(t, "x.example")
	_, err = Read(bytes.NewReader(raw), 100)
	if !errors.Is(err, ErrTooLarge) {
		t.Fatalf("bound 100: %v", err)
	}
	// Fragments that keep coming: bounded by max, records of 1 byte.
	big := hello(append(sniExt("y.example"), make([]byte, 4)...))
	_, err = Read(bytes.NewReader(records(big, 1)), 20)
	if !errors.Is(err, ErrTooLarge) {
		t.Fatalf("1-byte records over bound 20: %v", err)
	}
}

func TestGarbage(t *testing.T) {
	good := records(message(t, goHello(t, "g.example")), 100)
	for _, tc := range []struct {
		name   string
		in     []byte
		reason string
	}{
		{"http", []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"), "not-tls"},
		{"sslv2", []byte{0x80, 0x2e, 0x01, 0x03, 0x01, 0, 0x15}, "not-tls"},
		{"empty", nil, "eof"},
		{"short header", []byte{22, 3}, "eof"},
		{"zero length record", []byte{22, 3, 1, 0, 0}, "malformed"},
		{"record over 2^14", []byte{22, 3, 1, 0x40, 0x01}, "malformed"},
		{"server hello", records([]byte{2, 0, 0, 0}, 100), "malformed"},
		{"cut short", good[:len(good)-10], "eof"},
		{"alert inside", append(good[:105:105], 21, 3, 3, 0, 2, 2, 40), "malformed"},
		{"record past the hello", records(append(hello(sniExt("a.b")), 0, 0), 16384), "malformed"},
		{"truncated body", records(hello(sniExt("a.b"))[:4+40], 16384), "malformed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := tc.in
			if tc.name == "truncated body" {
				// A header announcing only the 40 bytes present.
				in = append([]byte(nil), in...)
				in[5+1], in[5+2], in[5+3] = 0, 0, 40
			}
			_, err := Read(bytes.NewReader(in), 0)
			if err == nil || Reason(err) != tc.reason {
				t.Fatalf("%v (reason %q), want %q", err, Reason(err), tc.reason)
			}
		})
	}
	// Layout errors inside the message.
	twice := append(sniExt("a.example"), sniExt("b.example")...)
	for name, msg := range map[string][]byte{
		"sni twice":        hello(twice),
		"ext past block":   hello([]byte{0, 10, 0, 50}),
		"odd suites":       append([]byte{1, 0, 0, 38, 3, 3}, append(make([]byte, 33), 0, 1, 0x13, 1, 0)...),
		"empty name list":  hello([]byte{0, 0, 0, 2, 0, 0}),
		"two host_names":   hello(sniTwoNames()),
		"trailing garbage": func() []byte { m := hello(sniExt("a.b")); m = append(m, 7); m[3]++; return m }(),
	} {
		_, err := Read(bytes.NewReader(records(msg, 16384)), 0)
		if !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v, want malformed", name, err)
		}
	}
}

func sniTwoNames() []byte {
	entry := func(n string) []byte {
		e := append([]byte{0}, binary.BigEndian.AppendUint16(nil, uint16(len(n)))...)
		return append(e, n...)
	}
	l := append(entry("a.example"), entry("b.example")...)
	list := append(binary.BigEndian.AppendUint16(nil, uint16(len(l))), l...)
	ext := append([]byte{0, 0}, binary.BigEndian.AppendUint16(nil, uint16(len(list)))...)
	return append(ext, list...)
}

// TestTimeout: a client that sends part of its hello and stops meets the
// read deadline, named "timeout".
func TestTimeout(t *testing.T) {
	raw := goHello(t, "slow.example")
	c, s := net.Pipe()
	defer c.Close()
	defer s.Close()
	go func() { _, _ = c.Write(raw[:20]) }()
	_ = s.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	_, err := Read(s, 0)
	if Reason(err) != "timeout" || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("%v (reason %q), want timeout", err, Reason(err))
	}
}

// BenchmarkRead is the peek's CPU cost per connection: Go's ClientHello
// (one record) read and parsed, and the same over 1-byte reads of records
// of 64 bytes (a client that fragments as badly as it can).
func BenchmarkRead(b *testing.B) {
	raw := goHello(b, "www.example.com")
	frag := records(message(b, raw), 64)
	for _, bc := range []struct {
		name string
		in   []byte
		one  bool
	}{{"one-record", raw, false}, {"64B-records-1B-reads", frag, true}} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(bc.in)))
			r := bytes.NewReader(bc.in)
			for b.Loop() {
				r.Reset(bc.in)
				var rd io.Reader = r
				if bc.one {
					rd = iotest.OneByteReader(r)
				}
				if h, err := Read(rd, 0); err != nil || h.ServerName != "www.example.com" {
					b.Fatal(h.ServerName, err)
				}
			}
		})
	}
}
