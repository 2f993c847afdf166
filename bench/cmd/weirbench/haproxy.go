package main

// HAProxy, the yardstick: what an operator would run instead of weir as a
// TCP load balancer. It runs in the router namespace as Debian packages it
// (scripts/bench-deps.sh installs it), in `mode tcp` with its own defaults
// (threads: one per CPU the process may use; maxconn from the file limit),
// listening on its own router address on the same ports as weir's VIP, each
// connection sent to the server on the port the client connected to (a
// server line without a port).

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// haproxyBin is the HAProxy executable, found on PATH or where Debian puts
// it (/usr/sbin is not on every root PATH).
func haproxyBin() (string, error) {
	if p, err := exec.LookPath("haproxy"); err == nil {
		return p, nil
	}
	if _, err := os.Stat("/usr/sbin/haproxy"); err == nil {
		return "/usr/sbin/haproxy", nil
	}
	return "", &skipError{"needs haproxy for the yardstick column (bash scripts/bench-deps.sh installs it; -haproxy=false leaves it out)"}
}

// haproxyVersion is the first line of `haproxy -v`, for the report.
func haproxyVersion(bin string) string {
	out, err := exec.Command(bin, "-v").Output()
	if err != nil {
		return "haproxy (version unknown)"
	}
	line, _, _ := strings.Cut(string(out), "\n")
	return strings.TrimSpace(line)
}

// haproxyConfig is HAProxy's config for the harness: one TCP frontend on
// listen's ports, one backend whose only server is to with no port (the
// client's destination port is used). Timeouts are set because HAProxy
// warns without them; they are longer than any run.
func haproxyConfig(listen, to string, ports []int) string {
	var binds []string
	for _, p := range ports {
		binds = append(binds, fmt.Sprintf("%s:%d", listen, p))
	}
	return fmt.Sprintf(`# weirbench: HAProxy as the yardstick, mode tcp, its defaults otherwise.
global
    log stderr format short local0 warning

defaults
    mode tcp
    log global
    timeout connect 5s
    timeout client 2m
    timeout server 2m

frontend weirbench
    bind %s
    default_backend server

backend server
    server server %s
`, strings.Join(binds, ","), to)
}
