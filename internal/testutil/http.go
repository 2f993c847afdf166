package testutil

import (
	"bufio"
	"io"
	"net/http"
	"testing"
)

// KeptAlive is a client's kept-alive HTTP/1.1 connection in a test: Do
// writes a raw request on it and reads the response, body drained, failing
// the test on any error, so that requests of one connection follow each
// other as a browser's do.
type KeptAlive struct {
	t  testing.TB
	c  io.Writer
	br *bufio.Reader
}

// NewKeptAlive reads responses from c through one buffered reader.
func NewKeptAlive(t testing.TB, c io.ReadWriter) *KeptAlive {
	return &KeptAlive{t: t, c: c, br: bufio.NewReader(c)}
}

// Do sends req (a whole raw request) and returns the response to it.
func (k *KeptAlive) Do(req string) *http.Response {
	k.t.Helper()
	if _, err := io.WriteString(k.c, req); err != nil {
		k.t.Fatalf("sending: %v", err)
	}
	resp, err := http.ReadResponse(k.br, nil)
	if err != nil {
		k.t.Fatalf("reading the response: %v", err)
	}
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		k.t.Fatalf("reading the body: %v", err)
	}
	return resp
}
