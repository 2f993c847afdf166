// Package clustertest starts a real redis-server for tests of the cluster
// and its users.
package clustertest

import (
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"weir/internal/testutil"
)

// Redis is a redis-server a test started on a loopback port, without
// persistence: Kill and Start model a Redis that dies and comes back empty.
type Redis struct {
	t    testing.TB
	port int
	cmd  *exec.Cmd
	log  *testutil.SyncBuffer
}

// StartRedis starts a redis-server for t and kills it when t ends; it skips
// t when redis-server is not installed (scripts/deps.sh installs Debian's).
// On failure t's log shows the server's.
func StartRedis(t testing.TB) *Redis {
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
	r := &Redis{t: t, port: port, log: &testutil.SyncBuffer{}}
	r.Start()
	t.Cleanup(func() {
		r.Kill()
		if t.Failed() {
			t.Logf("redis-server's log:\n%s", r.log.String())
		}
	})
	return r
}

// Addr is the server's host:port.
func (r *Redis) Addr() string { return "127.0.0.1:" + strconv.Itoa(r.port) }

// Start runs the server (again, empty) and waits until it answers PING.
func (r *Redis) Start() {
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

// Kill stops the server at once (SIGKILL) and waits for it to exit.
func (r *Redis) Kill() {
	if r.cmd == nil {
		return
	}
	r.cmd.Process.Kill()
	r.cmd.Wait()
	r.cmd = nil
}
