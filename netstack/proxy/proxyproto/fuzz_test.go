package proxyproto

import (
	"bytes"
	"errors"
	"io"
	"net/netip"
	"testing"
)

// FuzzRead feeds Read arbitrary bytes: it must not panic, must read no more
// than a header's bound, must leave the bytes after a header it accepts
// unread, and what it accepts must write back (Append) to a header that
// reads the same.
func FuzzRead(f *testing.F) {
	f.Add([]byte("PROXY TCP4 192.168.0.1 192.168.0.11 56324 443\r\nGET /"), uint8(Any))
	f.Add([]byte("PROXY TCP6 ::1 ::2 1 2\r\n"), uint8(V1))
	f.Add([]byte("PROXY UNKNOWN\r\n"), uint8(V1))
	f.Add([]byte("\r\n\r\n\x00\r\nQUIT\n\x21\x11\x00\x0c\xac\x13\x00\x01\xac\x13\x00\x03\xa6\x52\x00\x50GET"), uint8(V2))
	f.Add([]byte("\r\n\r\n\x00\r\nQUIT\n\x20\x00\x00\x00"), uint8(Any))
	f.Add([]byte("\r\n\r\n\x00\r\nQUIT\n\x21\x21\x00\x27"+string(make([]byte, 36))+"\x04\x00\x00"), uint8(V2))
	f.Fuzz(func(t *testing.T, in []byte, accept uint8) {
		v := Version(accept) & Any
		if v == 0 {
			v = Any
		}
		r := bytes.NewReader(in)
		h, err := Read(r, v)
		read := len(in) - r.Len()
		if read > 16+MaxV2Payload {
			t.Fatalf("read %d bytes", read)
		}
		if err != nil {
			if Reason(err) == "error" {
				t.Fatalf("unclassified error %v", err)
			}
			return
		}
		if h.Version&v == 0 {
			t.Fatalf("accepted a %v header with %v", h.Version, v)
		}
		// Parse of exactly the bytes read agrees.
		var h2 Header
		var perr error
		if h.Version == V1 {
			h2, perr = ParseV1(in[:read])
		} else {
			h2, perr = ParseV2(in[:read])
		}
		if perr != nil || h2 != h {
			t.Fatalf("Parse of the %d bytes read = %+v, %v; Read said %+v", read, h2, perr, h)
		}
		if h.Local {
			return
		}
		out := Append(nil, h.Version, h.Src, h.Dst)
		back, err := Read(bytes.NewReader(out), h.Version)
		if err != nil && !errors.Is(err, io.EOF) {
			t.Fatalf("reading back %q: %v", out, err)
		}
		// The writer unmaps an IPv4-mapped pair (TCP4), so compare unmapped.
		if unmap(back) != unmap(h) {
			t.Fatalf("round trip %+v -> %q -> %+v", h, out, back)
		}
	})
}

func unmap(h Header) Header {
	h.Version = 0
	h.Src = netip.AddrPortFrom(h.Src.Addr().Unmap(), h.Src.Port())
	h.Dst = netip.AddrPortFrom(h.Dst.Addr().Unmap(), h.Dst.Port())
	return h
}
