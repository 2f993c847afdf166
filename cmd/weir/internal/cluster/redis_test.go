package cluster

import (
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"go.uber.org/goleak"

	"weir/internal/testutil"
)

// TestMain checks for leaked goroutines. go-redis's dial prober, started
// after failed dials (Redis killed), sleeps a second before it sees the
// closed pool and ends: it outlives Close by at most that second.
func TestMain(m *testing.M) {
	testutil.VerifyNoLeaks(m, goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial"))
}

// redisServer is a redis-server the test started on a loopback port,
// without persistence: Kill and Start model a Redis that dies and comes
// back empty.
type redisServer struct {
	t    *testing.T
	port int
	cmd  *exec.Cmd
	log  *testutil.SyncBuffer
}

// startRedis starts a redis-server for t, or skips t when there is none
// (scripts/deps.sh installs Debian's redis-server).
func startRedis(t *testing.T) *redisServer {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("redis-server not installed (scripts/deps.sh installs it): skipping the cluster tests against a real Redis")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Skipf("no loopback TCP: %v", err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	r := &redisServer{t: t, port: port, log: &testutil.SyncBuffer{}}
	r.Start()
	t.Cleanup(func() {
		r.Kill()
		if t.Failed() {
			t.Logf("redis-server's log:\n%s", r.log.String())
		}
	})
	return r
}

func (r *redisServer) Addr() string { return "127.0.0.1:" + strconv.Itoa(r.port) }

// Start runs the server and waits until it answers.
func (r *redisServer) Start() {
	r.t.Helper()
	cmd := exec.Command("redis-server", "--port", strconv.Itoa(r.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", r.t.TempDir(), "--loglevel", "warning")
	cmd.Stdout, cmd.Stderr = r.log, r.log
	if err := cmd.Start(); err != nil {
		r.t.Fatalf("redis-server: %v", err)
	}
	r.cmd = cmd
	if !testutil.Within(10*time.Second, func() bool {
		c, err := net.DialTimeout("tcp", r.Addr(), 100*time.Millisecond)
		if err != nil {
			return false
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(time.Second))
		fmt.Fprintf(c, "PING\r\n")
		b := make([]byte, 7)
		n, _ := c.Read(b)
		return string(b[:n]) == "+PONG\r\n"
	}) {
		r.Kill()
		r.t.Fatalf("redis-server on %s does not answer", r.Addr())
	}
}

// Kill stops the server at once (SIGKILL) and waits for it.
func (r *redisServer) Kill() {
	if r.cmd == nil {
		return
	}
	r.cmd.Process.Kill()
	r.cmd.Wait()
	r.cmd = nil
}
