package netstack

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"weir/internal/testutil"
	"weir/netstack/proxy"
	"weir/policy"
)

// resetAfter is a target that reads the request head, writes sent and
// resets its connection (SO_LINGER 0).
func resetAfter(sent string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		c, bw, err := w.(http.Hijacker).Hijack()
		if err != nil {
			return
		}
		bw.WriteString(sent)
		bw.Flush()
		if tc, ok := c.(*net.TCPConn); ok {
			tc.SetLinger(0)
		}
		c.Close()
	}
}

// TestTargetResetVisible pins issue 23's Deliver 3 for a target that
// resets: before any of its response reached the client, the client gets a
// 502 (the access log's status, outcome bad-gateway), also when the
// response head had arrived and waited in weir's buffer (it used to get an
// empty reply with status 0, outcome ok); once a part of a response is out,
// the client's connection is reset, so a body that its close ends is not
// taken for a whole one.
func TestTargetResetVisible(t *testing.T) {
	big := strings.Repeat("b", 64<<10) // past the client writer's buffer: it is flushed
	mux := http.NewServeMux()
	mux.Handle("/before-head", resetAfter(""))
	mux.Handle("/in-head", resetAfter("HTTP/1.1 200 OK\r\nContent-Len"))
	mux.Handle("/after-head", resetAfter("HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n56 bytes"))
	mux.Handle("/close-delimited", resetAfter("HTTP/1.1 200 OK\r\n\r\n"+big))
	r, adm, _ := httpRig(t, mux, policy.HTTPOptions{HeaderTimeout: time.Second, MaxHeaderBytes: 4096})
	vip := netip.AddrPortFrom(vipV4, 80)
	for i, tc := range []struct {
		path   string
		status int // the client's status; 0: the connection is reset
	}{
		{"/before-head", 502},
		{"/in-head", 502},
		{"/after-head", 502},
		{"/close-delimited", 0},
	} {
		t.Run(tc.path, func(t *testing.T) {
			c := dial(t, r.client, vip)
			defer c.Close()
			c.SetDeadline(time.Now().Add(10 * time.Second))
			io.WriteString(c, "GET "+tc.path+" HTTP/1.1\r\nHost: x\r\n\r\n")
			br := bufio.NewReader(c)
			resp, err := http.ReadResponse(br, nil)
			if tc.status != 0 {
				if err != nil || resp.StatusCode != tc.status {
					t.Fatalf("response %v, %v; want %d", resp, err, tc.status)
				}
				io.Copy(io.Discard, resp.Body)
			} else {
				if err == nil {
					var n int64
					n, err = io.Copy(io.Discard, resp.Body)
					if err == nil {
						t.Fatalf("a cut close-delimited body read as whole (%d of %d bytes): want the connection reset", n, len(big))
					}
				}
				if errors.Is(err, os.ErrDeadlineExceeded) || !strings.Contains(err.Error(), "reset") {
					t.Errorf("cut response: %v, want a reset", err)
				}
			}
			testutil.Eventually(t, 5*time.Second, func() bool { return adm.nEnds.Load() == int64(i+1) }, "the request's End")
			adm.mu.Lock()
			re := adm.reqEnds[len(adm.reqEnds)-1]
			adm.mu.Unlock()
			want := tc.status
			if want == 0 {
				want = 200 // the head that went out
			}
			if re.Status != want {
				t.Errorf("request End status %d, want %d", re.Status, want)
			}
			if o := adm.outcomes(); o[len(o)-1] != proxy.BadGateway {
				t.Errorf("outcome %v, want bad-gateway", o[len(o)-1])
			}
		})
	}
	if n := r.stats().HTTPBadGateway; n != 4 {
		t.Errorf("HTTPBadGateway %d, want 4", n)
	}
	if n := adm.nTargetFailed.Load(); n != 0 {
		t.Errorf("TargetFailed %d times for resets, want 0", n)
	}
}
