// Package clustertest starts a real redis-server for tests of the cluster
// and its users.
package clustertest

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"weir/internal/netns"
	"weir/internal/testutil"
)

// Redis is a redis-server a test started on a loopback port, without
// persistence: Kill and Start model a Redis that dies and comes back empty.
type Redis struct {
	t    testing.TB
	host string    // the address it binds
	ns   *netns.NS // the namespace it runs in; nil: the test's own
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
	return start(t, &Redis{t: t, host: "127.0.0.1", port: port, log: &testutil.SyncBuffer{}})
}

// StartRedisIn is StartRedis for a server inside ns on host:6379 (an
// address of the namespace), for instances in other namespaces that reach
// it through their routes.
func StartRedisIn(t testing.TB, ns *netns.NS, host string) *Redis {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("redis-server not installed (scripts/deps.sh installs it): skipping the cluster tests against a real Redis")
	}
	return start(t, &Redis{t: t, host: host, ns: ns, port: 6379, log: &testutil.SyncBuffer{}})
}

func start(t testing.TB, r *Redis) *Redis {
	t.Helper()
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
func (r *Redis) Addr() string { return net.JoinHostPort(r.host, strconv.Itoa(r.port)) }

// Start runs the server (again, empty) and waits until it answers PING.
func (r *Redis) Start() {
	r.t.Helper()
	args := []string{"--port", strconv.Itoa(r.port), "--bind", r.host,
		"--save", "", "--appendonly", "no", "--dir", r.t.TempDir(), "--loglevel", "warning"}
	if r.ns != nil {
		// Clients in other namespaces connect from non-loopback addresses,
		// which protected mode refuses without a password; the namespace
		// is the test's own.
		args = append(args, "--protected-mode", "no")
	}
	cmd := exec.Command("redis-server", args...)
	cmd.Stdout, cmd.Stderr = r.log, r.log
	var err error
	if r.ns != nil {
		// The child inherits the namespace of the thread that forks it.
		err = r.ns.Do(cmd.Start)
	} else {
		err = cmd.Start()
	}
	if err != nil {
		r.t.Fatalf("redis-server: %v", err)
	}
	r.cmd = cmd
	dial := func() (net.Conn, error) { return net.DialTimeout("tcp", r.Addr(), 100*time.Millisecond) }
	if r.ns != nil {
		dial = func() (net.Conn, error) {
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			defer cancel()
			return r.ns.Dial(ctx, "tcp", r.Addr())
		}
	}
	if !testutil.Within(10*time.Second, func() bool {
		c, err := dial()
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
		r.t.Fatalf("redis-server on %s does not answer; its log:\n%s", r.Addr(), r.log.String())
	}
}

// Pid is the running server's process id (0 when it is not running).
func (r *Redis) Pid() int {
	if r.cmd == nil || r.cmd.Process == nil {
		return 0
	}
	return r.cmd.Process.Pid
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
