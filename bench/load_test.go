package bench

import (
	"context"
	"net"
	"net/http"
	"testing"
	"time"

	"weir/internal/testutil"
)

// TestMain fails the package if a test leaves a goroutine running: a load
// ends with its clients, a backend's Close ends its server.
func TestMain(m *testing.M) { testutil.VerifyNoLeaks(m) }

// TestLoadAgainstBackends runs a bounded load over loopback against two real
// backends behind a tiny round-robin TCP relay-free setup: the dialer itself
// alternates, so the test pins the generator's counting, not a balancer.
func TestLoadAgainstBackends(t *testing.T) {
	var addrs []string
	for _, name := range []string{"a", "b"} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		b := &Backend{Name: name}
		go b.Serve(ln)
		t.Cleanup(func() { b.Close() })
		addrs = append(addrs, ln.Addr().String())
	}
	// A refusing address: a closed listener.
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	closed := ln.Addr().String()
	ln.Close()
	// A 503 server.
	ln503, _ := net.Listen("tcp", "127.0.0.1:0")
	srv503 := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(503)
		w.Write([]byte("<html><body><h1>Service Unavailable</h1><p>virtual server web: maxConnections 2 reached (2 open)</p></body></html>"))
	})}
	go srv503.Serve(ln503)
	t.Cleanup(func() { srv503.Close() })

	seq := []string{addrs[0], addrs[1], addrs[0], closed, ln503.Addr().String()}
	i := 0
	var d net.Dialer
	dial := func(ctx context.Context, network, _ string) (net.Conn, error) {
		a := seq[i%len(seq)]
		i++
		return d.DialContext(ctx, network, a)
	}
	res := Load{Dial: dial, Addr: "vip:80", Clients: 1, Requests: 50, Duration: 10 * time.Second}.Run(context.Background())
	if res.Requests != 50 || res.OK != 30 || res.PerTarget["a"] != 20 || res.PerTarget["b"] != 10 ||
		res.Reset != 10 || res.Refused503 != 10 {
		t.Fatalf("result %+v", res)
	}
	if got := res.Reasons["virtual server web: maxConnections 2 reached (2 open)"]; got != 10 {
		t.Errorf("reasons %v", res.Reasons)
	}
}

// TestBackendHold: a held request is in progress (Active) and unanswered
// until Hold closes, then answered.
func TestBackendHold(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hold := make(chan struct{})
	b := &Backend{Name: "held", Hold: hold}
	go b.Serve(ln)
	t.Cleanup(func() { b.Close() })
	done := make(chan Result, 1)
	go func() {
		done <- Load{Addr: ln.Addr().String(), Clients: 2, Requests: 2, Duration: 10 * time.Second}.Run(context.Background())
	}()
	testutil.Within(5*time.Second, func() bool { return b.Active() == 2 })
	if b.Active() != 2 || b.Served() != 0 {
		t.Fatalf("before Hold closes: %d active, %d served; want 2 and 0", b.Active(), b.Served())
	}
	select {
	case r := <-done:
		t.Fatalf("load finished while held: %+v", r)
	case <-time.After(50 * time.Millisecond):
	}
	close(hold)
	if r := <-done; r.OK != 2 || b.Served() != 2 {
		t.Fatalf("after Hold closed: %+v, served %d", r, b.Served())
	}
}

func TestLoadStopsOnDuration(t *testing.T) {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	b := &Backend{Name: "slow", Delay: 50 * time.Millisecond}
	go b.Serve(ln)
	defer b.Close()
	var d net.Dialer
	start := time.Now()
	res := Load{Dial: d.DialContext, Addr: ln.Addr().String(), Clients: 4, Duration: 300 * time.Millisecond}.Run(context.Background())
	if el := time.Since(start); el > 3*time.Second {
		t.Fatalf("load ran %v past its 300 ms bound", el)
	}
	if res.OK == 0 || b.MaxActive() > 4 {
		t.Fatalf("ok=%d maxActive=%d", res.OK, b.MaxActive())
	}
}
