package obs

import (
	"bytes"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"weir/internal/testutil"
)

// TestMain fails the package if a test leaves a goroutine running: Close
// must stop the non-blocking log's writer goroutine.
func TestMain(m *testing.M) { testutil.VerifyNoLeaks(m) }

func TestLogsJSONNonBlocking(t *testing.T) {
	var buf testutil.SyncBuffer
	l, err := New(Options{Output: &buf, Format: "json"})
	if err != nil {
		t.Fatal(err)
	}
	l.Info().Str("target", "a").Msg("STATS")
	l.Close()
	var m map[string]any
	if err := json.Unmarshal(bytes.TrimSpace([]byte(buf.String())), &m); err != nil {
		t.Fatalf("line %q is not JSON: %v", buf.String(), err)
	}
	if m["message"] != "STATS" || m["target"] != "a" {
		t.Errorf("got %v", m)
	}
}

func TestLogsBadOptions(t *testing.T) {
	if _, err := New(Options{Format: "xml"}); err == nil {
		t.Error("format xml accepted")
	}
	if _, err := New(Options{Level: "loud"}); err == nil {
		t.Error("level loud accepted")
	}
}

func TestLimiter(t *testing.T) {
	var l Limiter
	t0 := time.Unix(0, 0)
	if ok, _ := l.Allow("a", t0); !ok {
		t.Fatal("first line held back")
	}
	for i := 1; i <= 5; i++ {
		if ok, _ := l.Allow("a", t0.Add(time.Duration(i)*100*time.Millisecond)); ok {
			t.Fatalf("line %d within a second let through", i)
		}
	}
	if ok, _ := l.Allow("b", t0); !ok {
		t.Fatal("another key held back")
	}
	ok, s := l.Allow("a", t0.Add(1100*time.Millisecond))
	if !ok || s != 5 {
		t.Fatalf("after a second: ok=%v suppressed=%d, want true 5", ok, s)
	}
}

func TestAccessLog(t *testing.T) {
	start := time.Date(2005, 5, 11, 7, 26, 23, 0, time.FixedZone("", -5*3600))
	rec := AccessRecord{Start: start, Client: "198.18.0.2:40000", VIP: "198.18.1.1:80", Service: "web",
		Outcome: "503", Reason: "all targets at limit", RequestLine: "GET /wlm/BeenThere HTTP/1.1", Status: 503, BytesOut: 431,
		Duration: 1500 * time.Microsecond}
	// The seed's Example 18-7 line, then the target (none: refused) and the
	// duration in microseconds.
	if got, want := CLF(rec), `198.18.0.2 - - [11/May/2005:07:26:23 -0500] "GET /wlm/BeenThere HTTP/1.1" 503 431 "-" 1500`; got != want {
		t.Errorf("CLF:\n got %s\nwant %s", got, want)
	}
	tcp := AccessRecord{Start: start, Client: "[fd00::2]:5000", VIP: "[fd00::1]:23", Target: "t1", Outcome: "ok", BytesOut: 10}
	if got := CLF(tcp); !strings.HasPrefix(got, `fd00::2 - - [`) || !strings.HasSuffix(got, `"TCP [fd00::1]:23 t1" 200 10 "t1" 0`) {
		t.Errorf("CLF tcp: %s", got)
	}
	var buf bytes.Buffer
	a := NewAccessLog(&buf, false)
	a.Log(rec)
	a.Flush()
	var m map[string]any
	if err := json.Unmarshal(buf.Bytes(), &m); err != nil {
		t.Fatal(err)
	}
	if m["outcome"] != "503" || m["request"] != "GET /wlm/BeenThere HTTP/1.1" || m["bytes_out"] != 431.0 {
		t.Errorf("json access line %v", m)
	}
	if _, ok := m["queue_wait_ms"]; ok {
		t.Errorf("queue_wait_ms on a line that did not queue: %v", m)
	}
	// A request that waited in a limit's queue says how long.
	rec.QueueWait = 1250 * time.Millisecond
	if got := CLF(rec); !strings.HasSuffix(got, `"-" 1500 queue=1250000`) {
		t.Errorf("CLF of a queued request: %s", got)
	}
	buf.Reset()
	a.Log(rec)
	a.Flush()
	m = nil
	if err := json.Unmarshal(buf.Bytes(), &m); err != nil {
		t.Fatal(err)
	}
	if m["queue_wait_ms"] != 1250.0 {
		t.Errorf("json access line of a queued request: %v", m)
	}
}

// TestCloseKeepsOutputOpen: closing the log must not close its output
// (stderr), where weir still prints its exit error.
func TestCloseKeepsOutputOpen(t *testing.T) {
	f, err := os.CreateTemp(t.TempDir(), "log")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	l, err := New(Options{Output: f, Format: "json"})
	if err != nil {
		t.Fatal(err)
	}
	l.Info().Msg("last line")
	l.Close()
	if _, err := f.WriteString("weir: exit error\n"); err != nil {
		t.Fatalf("output closed by Logs.Close: %v", err)
	}
}

// TestAccessLogServerName: a tls connection's line carries its server name,
// in JSON ("sni") and in CLF (the request "TLS vip name target").
func TestAccessLogServerName(t *testing.T) {
	r := AccessRecord{Start: time.Unix(0, 0).UTC(), Client: "198.18.5.1:40000", VIP: "198.18.0.10:443", Service: "shop",
		ServerName: "shop.example", Target: "t1", Outcome: "ok", BytesOut: 10}
	var b strings.Builder
	l := NewAccessLog(&b, false)
	l.Log(r)
	if err := l.Flush(); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), `"sni":"shop.example"`) {
		t.Errorf("JSON line %q lacks the server name", b.String())
	}
	if got := CLF(r); !strings.Contains(got, `"TLS 198.18.0.10:443 shop.example t1" 200`) {
		t.Errorf("CLF %q", got)
	}
	r.ServerName = ""
	b.Reset()
	l.Log(r)
	_ = l.Flush()
	if strings.Contains(b.String(), "sni") || !strings.Contains(CLF(r), `"TCP 198.18.0.10:443 t1"`) {
		t.Errorf("no server name: %q, %q", b.String(), CLF(r))
	}
}
