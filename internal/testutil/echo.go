package testutil

import (
	"crypto/sha256"
	"io"
	"math/rand/v2"
	"net"
	"testing"
	"time"
)

// EchoTransfer sends n pseudo-random bytes on c (a TCP connection to an echo
// server), half-closes it, reads everything back and fails t unless exactly
// those n bytes return (compared by SHA-256). It closes c. The whole
// exchange is bounded by 60 s; label names the peer in failures.
func EchoTransfer(t testing.TB, c net.Conn, label string, n int) {
	t.Helper()
	defer c.Close()
	c.SetDeadline(time.Now().Add(60 * time.Second))
	sent := sha256.New()
	errc := make(chan error, 1)
	go func() {
		rng := rand.NewChaCha8([32]byte{byte(n), byte(n >> 8), 42})
		buf := make([]byte, 128<<10)
		for left := n; left > 0; {
			b := buf[:min(left, len(buf))]
			rng.Read(b)
			sent.Write(b)
			if _, err := c.Write(b); err != nil {
				errc <- err
				return
			}
			left -= len(b)
		}
		if cw, ok := c.(interface{ CloseWrite() error }); ok {
			errc <- cw.CloseWrite()
			return
		}
		errc <- nil
	}()
	got := sha256.New()
	m, err := io.Copy(got, c)
	if werr := <-errc; werr != nil {
		t.Fatalf("%s: send: %v", label, werr)
	}
	if err != nil || m != int64(n) {
		t.Fatalf("%s: echoed %d of %d bytes: %v", label, m, n, err)
	}
	if string(got.Sum(nil)) != string(sent.Sum(nil)) {
		t.Fatalf("%s: the %d bytes came back changed", label, n)
	}
}
