package admit_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"weir/bench"
	"weir/cmd/weir/internal/lab"
	"weir/netstack"
	"weir/policy"
)

// TestSequentialClientsNeverRefused pins item 4 of issue 11: a tcp
// connection's slots are free once the client has seen it finished (both
// FINs), so a client that reconnects the moment it has read its last
// connection's end is never refused at maxConnections 1, whichever side
// closes first and whichever way the bytes go. Both counts are pinned: the
// service's enforced limit and the target's MaxConnections.
func TestSequentialClientsNeverRefused(t *testing.T) {
	const n = 200
	cases := []struct {
		name   string
		body   int // response size
		upload int // request body size
		// clientFirst: the client keeps the connection alive, reads the
		// response by its length and half-closes first.
		clientFirst bool
	}{
		{name: "target closes first, download", body: 64 << 10},
		{name: "target closes first, upload", upload: 64 << 10},
		{name: "client closes first, download", body: 64 << 10, clientFirst: true},
		{name: "client closes first, upload", upload: 64 << 10, clientFirst: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := lab.WebConfig([]int{1}, []int64{1})
			vs := cfg.Services[0]
			vs.Proto = policy.ProtoTCP
			vs.Limits = policy.Limits{MaxConnections: 1, EnforceConnections: true}
			l := lab.Must(t, cfg, lab.Options{Backend: func(_ policy.TargetKey, b *bench.Backend) { b.Body = tc.body }})
			for i := range n {
				if err := sequentialClient(l, tc.body, tc.upload, tc.clientFirst); err != nil {
					t.Fatalf("connection %d: %v; refusals %+v", i, err, l.App.Status().Refusals)
				}
			}
			if r := refusals(l.App, "virtual server", "maxConnections"); r != 0 {
				t.Errorf("%d connections refused by the service's maxConnections 1", r)
			}
			if r := refusals(l.App, "balancer", "targets"); r != 0 {
				t.Errorf("%d connections refused with the target at its maxConnections 1", r)
			}
		})
	}
}

// sequentialClient is one connection of an `ab -c 1` style client: one
// request (an upload when upload > 0), its response, the connection's end
// read to EOF; with clientFirst the client half-closes first, after the
// response, and the backend follows.
func sequentialClient(l *lab.Lab, body, upload int, clientFirst bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := l.Dial(ctx, "tcp", "198.19.0.80:80")
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	method, conn := "GET", "close"
	if upload > 0 {
		method = "POST"
	}
	if clientFirst {
		conn = "keep-alive"
	}
	head := fmt.Sprintf("%s / HTTP/1.1\r\nHost: x\r\nConnection: %s\r\nContent-Length: %d\r\n\r\n", method, conn, upload)
	if _, err := io.Copy(c, io.MultiReader(bytes.NewBufferString(head), io.LimitReader(zeros{}, int64(upload)))); err != nil {
		return err
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return err
	}
	got, err := io.Copy(io.Discard, resp.Body)
	if err != nil {
		return err
	}
	if want := max(body, len("t1\n")); resp.StatusCode != 200 || got != int64(want) {
		return fmt.Errorf("status %d, %d bytes, want 200 and %d (%s)", resp.StatusCode, got, want, resp.Header.Get("X-Weir-Limit"))
	}
	if clientFirst {
		if err := c.(*netstack.Conn).CloseWrite(); err != nil {
			return err
		}
	}
	if rest, err := io.Copy(io.Discard, br); err != nil || rest != 0 {
		return fmt.Errorf("after the response: %d bytes, %v; want EOF", rest, err)
	}
	return nil
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}
