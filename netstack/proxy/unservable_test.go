package proxy

import (
	"bufio"
	"net/http"
	"strings"
	"testing"
)

func TestUnservable(t *testing.T) {
	for _, tc := range []struct {
		head string
		want int
	}{
		{"GET / HTTP/1.1\r\nHost: web\r\n\r\n", 0},
		{"GET / HTTP/1.1\nHost: web:8080\n\n", 0},
		{"GET / HTTP/1.1\r\nHost: [fd00::1]:80\r\n\r\n", 0},
		{"GET / HTTP/1.0\r\n\r\n", 0},
		{"GET http://abs.example/ HTTP/1.1\r\nHost: web\r\n\r\n", 0},
		{"OPTIONS * HTTP/1.1\r\nHost: web\r\n\r\n", 0},
		{"GET / HTTP/1.1\r\n\r\n", 400},
		{"GET / HTTP/1.1\r\nHost: a b\r\n\r\n", 400},
		{"GET / HTTP/1.1\r\nHost: a,b\r\n\r\n", 400},
		{"GET / HTTP/1.1\r\nHost: user@a\r\n\r\n", 400},
		{"GET / HTTP/1.1\r\nHost: web\r\nX-A: one\r\n two\r\n\r\n", 400},
		{"POST / HTTP/1.1\r\nHost: web\r\nTransfer-Encoding:\r\n\tchunked\r\n\r\n", 400},
		{"GET / HTTP/2.0\r\nHost: web\r\n\r\n", 505},
		{"PRI * HTTP/2.0\r\n\r\n", 505},
		{"CONNECT web:443 HTTP/1.1\r\nHost: web:443\r\n\r\n", 501},
	} {
		in, err := http.ReadRequest(bufio.NewReader(strings.NewReader(tc.head)))
		if err != nil {
			t.Fatalf("%q: %v", tc.head, err)
		}
		if got := Unservable(in, []byte(tc.head)); got != tc.want {
			t.Errorf("%q: %d, want %d", tc.head, got, tc.want)
		}
	}
}
