package tlshello

import (
	"bytes"
	"errors"
	"testing"
	"testing/iotest"
)

// FuzzRead feeds Read arbitrary bytes: it must not panic, must read no
// more than the bound allows, must read exactly what it returns in Raw
// (the rest left unread), must name every error with a known reason, and
// what it accepts must read the same again byte by byte and refragmented
// in records of 7 bytes.
func FuzzRead(f *testing.F) {
	f.Add(goHello(f, "www.example.com"), uint16(0))
	f.Add(goHello(f, ""), uint16(0))
	f.Add(records(hello(sniExt("A.Example.")), 3), uint16(0))
	f.Add(records(hello(nil), 16384), uint16(60))
	f.Add([]byte("GET / HTTP/1.1\r\n\r\n"), uint16(0))
	f.Add([]byte{22, 3, 1, 0, 4, 1, 0, 0, 0}, uint16(0))
	f.Fuzz(func(t *testing.T, in []byte, max uint16) {
		r := bytes.NewReader(in)
		h, err := Read(r, int(max))
		read := len(in) - r.Len()
		bound := int(max)
		if bound <= 0 {
			bound = MaxHello
		}
		// The message bound, plus a header per record (at most one
		// record per message byte), plus the record that tripped it.
		if read > 6*(bound+4)+5+maxRecord {
			t.Fatalf("read %d bytes with bound %d", read, bound)
		}
		if err != nil {
			if Reason(err) == "error" {
				t.Fatalf("unclassified error %v", err)
			}
			return
		}
		if read != len(h.Raw) || !bytes.Equal(h.Raw, in[:read]) {
			t.Fatalf("read %d bytes, Raw holds %d", read, len(h.Raw))
		}
		if n, nerr := Normalize(h.ServerName); h.ServerName != "" && (nerr != nil || n != h.ServerName) {
			t.Fatalf("name %q not normalised: %q %v", h.ServerName, n, nerr)
		}
		h2, err := Read(iotest.OneByteReader(bytes.NewReader(in)), int(max))
		if err != nil || h2.ServerName != h.ServerName || !bytes.Equal(h2.Raw, h.Raw) {
			t.Fatalf("byte by byte: %q %v, want %q", h2.ServerName, err, h.ServerName)
		}
		h3, err := Read(bytes.NewReader(records(message(t, h.Raw), 7)), int(max))
		if err != nil && !errors.Is(err, ErrTooLarge) || err == nil && h3.ServerName != h.ServerName {
			t.Fatalf("in 7-byte records: %q %v, want %q", h3.ServerName, err, h.ServerName)
		}
	})
}
