//go:build linux

package e2e

// End-to-end tests of issue 28 (udp services) with real DNS: dnsmasq per
// target on the namespace's loopback, dig (bind9-dnsutils) and Go sockets
// as clients through weir's VIPs.

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"weir/cmd/weir/api"
	"weir/internal/netns"
	"weir/internal/testutil"
)

// dnsmasq serves one target: every A query for who.test is answered with
// answer, on addrs (IPv4 and IPv6) port 5353, until the test ends. It
// returns the process.
func (w *weirProc) dnsmasq(answer string, addrs ...string) *os.Process {
	w.t.Helper()
	return w.dnsmasqIn(w.ns, answer, addrs...)
}

// dnsmasqIn is dnsmasq run in ns (weir's namespace, or a target namespace
// weir's reaches: its readiness is asked from weir's).
func (w *weirProc) dnsmasqIn(ns *netns.NS, answer string, addrs ...string) *os.Process {
	w.t.Helper()
	path, err := exec.LookPath("dnsmasq")
	if err != nil {
		w.t.Skip("skipping: dnsmasq (dnsmasq-base) is not installed; scripts/deps.sh installs it")
	}
	args := []string{"--keep-in-foreground", "--conf-file=/dev/null", "--no-resolv", "--no-hosts", "--no-poll",
		"--bind-interfaces", "--port=5353", "--pid-file=", "--user=root", "--cache-size=0",
		"--address=/who.test/" + answer}
	for _, a := range addrs {
		args = append(args, "--listen-address="+a)
	}
	started := make(chan error, 1)
	var cmd *exec.Cmd
	done := make(chan error, 1)
	go func() {
		done <- ns.Do(func() error {
			cmd = exec.Command(path, args...)
			cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
			var out strings.Builder
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := cmd.Start(); err != nil {
				started <- err
				return err
			}
			started <- nil
			err := cmd.Wait()
			if err != nil && !strings.Contains(err.Error(), "killed") {
				return fmt.Errorf("dnsmasq: %v\n%s", err, out.String())
			}
			return nil
		})
	}()
	if err := <-started; err != nil {
		w.t.Fatalf("dnsmasq: %v", err)
	}
	w.t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGCONT)
		cmd.Process.Kill()
		if err := <-done; err != nil {
			w.t.Error(err)
		}
	})
	// Ready when it answers directly.
	for _, a := range addrs {
		target := net.JoinHostPort(a, "5353")
		deadline := time.Now().Add(10 * time.Second)
		for {
			if _, _, err := w.dnsQuery(target, 300*time.Millisecond); err == nil {
				break
			}
			if time.Now().After(deadline) {
				w.t.Fatalf("dnsmasq on %s does not answer", target)
			}
		}
	}
	return cmd.Process
}

// dnsQuery sends one A query for who.test to addr from a new unconnected
// socket in the namespace and returns the answer's address and the
// reply's source.
func (w *weirProc) dnsQuery(addr string, wait time.Duration) (netip.Addr, netip.AddrPort, error) {
	var ans netip.Addr
	var from netip.AddrPort
	err := w.ns.Do(func() error {
		c, err := net.ListenUDP("udp", nil)
		if err != nil {
			return err
		}
		defer c.Close()
		ans, from, err = dnsAsk(c, netip.MustParseAddrPort(addr), 0x5a5a, wait)
		return err
	})
	return ans, from, err
}

// dnsAsk sends an A query for who.test with id from c to addr and reads
// the reply with that id, returning the first A record and the source.
func dnsAsk(c *net.UDPConn, addr netip.AddrPort, id uint16, wait time.Duration) (netip.Addr, netip.AddrPort, error) {
	a, from, _, err := dnsAskTOS(c, addr, id, wait)
	return a, from, err
}

// recvTOS makes c report the ToS (IPv4) and traffic class (IPv6) of what
// it receives, for dnsAskTOS.
func recvTOS(c *net.UDPConn) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	err = rc.Control(func(fd uintptr) {
		if serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_RECVTOS, 1); serr != nil {
			return
		}
		serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_RECVTCLASS, 1)
	})
	if err == nil {
		err = serr
	}
	return err
}

// dnsAskTOS is dnsAsk that also returns the reply's ToS byte (IPv4) or
// traffic class (IPv6) when c has recvTOS on (-1: none reported).
func dnsAskTOS(c *net.UDPConn, addr netip.AddrPort, id uint16, wait time.Duration) (netip.Addr, netip.AddrPort, int, error) {
	q := binary.BigEndian.AppendUint16(nil, id)
	q = append(q, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0) // RD, one question
	q = append(q, 3, 'w', 'h', 'o', 4, 't', 'e', 's', 't', 0, 0, 1, 0, 1)
	if _, err := c.WriteToUDPAddrPort(q, addr); err != nil {
		return netip.Addr{}, netip.AddrPort{}, -1, err
	}
	c.SetReadDeadline(time.Now().Add(wait))
	b := make([]byte, 1500)
	oob := make([]byte, 128)
	for {
		n, oobn, _, from, err := c.ReadMsgUDPAddrPort(b, oob)
		if err != nil {
			return netip.Addr{}, netip.AddrPort{}, -1, err
		}
		if n < 12 || binary.BigEndian.Uint16(b) != id {
			continue
		}
		tos := -1
		if msgs, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
			for _, m := range msgs {
				switch {
				case m.Header.Level == unix.IPPROTO_IP && m.Header.Type == unix.IP_TOS && len(m.Data) >= 1:
					tos = int(m.Data[0])
				case m.Header.Level == unix.IPPROTO_IPV6 && m.Header.Type == unix.IPV6_TCLASS && len(m.Data) >= 4:
					tos = int(binary.NativeEndian.Uint32(m.Data))
				}
			}
		}
		// The answer's A record is the reply's last 4 bytes (one
		// question, one answer, no additional records).
		if binary.BigEndian.Uint16(b[6:]) != 1 || n < 16 {
			return netip.Addr{}, from, tos, fmt.Errorf("reply without one answer (%d bytes)", n)
		}
		a, _ := netip.AddrFromSlice(b[n-4 : n])
		return a, from, tos, nil
	}
}

// dnsBurst sends n queries to addr, workers at a time, each from a new
// socket (a new source port: a new session through weir), and returns how
// many were answered and how long it took.
func (w *weirProc) dnsBurst(addr string, n, workers int) (int, time.Duration) {
	w.t.Helper()
	return w.dnsBurstWait(addr, n, workers, 3*time.Second)
}

// dnsBurstWait is dnsBurst waiting at most wait for each reply.
func (w *weirProc) dnsBurstWait(addr string, n, workers int, wait time.Duration) (int, time.Duration) {
	w.t.Helper()
	to := netip.MustParseAddrPort(addr)
	var answered sync.WaitGroup
	var mu sync.Mutex
	ok := 0
	start := time.Now()
	for i := range workers {
		answered.Go(func() {
			err := w.ns.Do(func() error {
				for j := i; j < n; j += workers {
					c, err := net.ListenUDP("udp", nil)
					if err != nil {
						return err
					}
					_, _, err = dnsAsk(c, to, uint16(j), wait)
					c.Close()
					if err == nil {
						mu.Lock()
						ok++
						mu.Unlock()
					}
				}
				return nil
			})
			if err != nil {
				w.t.Error(err)
			}
		})
	}
	answered.Wait()
	return ok, time.Since(start)
}

// dig runs dig inside the namespace: one query for who.test to vip port
// 53, from the new source port dig picks. It returns the answer and dig's
// SERVER line.
func (w *weirProc) dig(path, vip string) (string, string, error) {
	var out []byte
	err := w.ns.Do(func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		var err error
		out, err = exec.CommandContext(ctx, path, "@"+vip, "-p", "53", "+tries=1", "+time=3", "+noall", "+answer", "+stats", "who.test", "A").CombinedOutput()
		return err
	})
	if err != nil {
		return "", "", fmt.Errorf("dig: %v\n%s", err, out)
	}
	var answer, server string
	for _, l := range strings.Split(string(out), "\n") {
		if f := strings.Fields(l); len(f) == 5 && f[0] == "who.test." && f[3] == "A" {
			answer = f[4]
		}
		if strings.HasPrefix(l, ";; SERVER:") {
			server = l
		}
	}
	if answer == "" {
		return "", server, fmt.Errorf("dig: no answer\n%s", out)
	}
	return answer, server, nil
}

// TestE2EUDPDNS: DNS through weir's udp services, once over IPv4 and once
// over IPv6. 300 dig queries (each from a new source port: a session of
// its own, ended by its one reply) over two dnsmasq targets weighted 2:1
// split 200/100 with none lost, every answer from the VIP (dig discards a
// reply from another source: "reply from unexpected source"); the relay's
// counters and the targets' picks agree. A target with maxConnections 3
// serves three Go clients while the fourth one's datagrams are dropped and
// counted (no reply, no ICMP); the 2 s idle timeout frees the slots and the
// fourth is served. Every reply of the capped services carries the ToS its
// rule marks (0xB8), IPv4 ToS and IPv6 traffic class alike.
func TestE2EUDPDNS(t *testing.T) {
	w := startWeir(t, "udp.yaml")
	w.addIPv6Targets()
	digPath, err := exec.LookPath("dig")
	if err != nil {
		t.Skip("skipping: dig (bind9-dnsutils) is not installed; scripts/deps.sh installs it")
	}
	w.dnsmasq("198.18.9.1", "198.18.1.1", "fd00:1::1")
	w.dnsmasq("198.18.9.2", "198.18.1.2", "fd00:1::2")
	w.dnsmasq("198.18.9.3", "198.18.1.3", "fd00:1::3")
	for _, ipv := range ipVersions() {
		t.Run(ipv.name, func(t *testing.T) {
			vipHost := func(n int) string { h, _, _ := net.SplitHostPort(ipv.vip(n, 53)); return h }
			before := w.status().UDP

			// 300 dig queries, 6 at a time.
			const queries, workers = 300, 6
			var mu sync.Mutex
			got := map[string]int{}
			var failures []string
			var wg sync.WaitGroup
			start := time.Now()
			for i := range workers {
				wg.Go(func() {
					for range queries / workers {
						ans, server, err := w.dig(digPath, vipHost(53))
						mu.Lock()
						if err != nil {
							failures = append(failures, err.Error())
						} else {
							got[ans]++
							if !strings.Contains(server, vipHost(53)+"#53") {
								failures = append(failures, fmt.Sprintf("worker %d: server line %q", i, server))
							}
						}
						mu.Unlock()
					}
				})
			}
			wg.Wait()
			elapsed := time.Since(start)
			t.Logf("%d dig queries in %v (%.0f queries/s, each a dig process): answers %v", queries, elapsed.Round(time.Millisecond), queries/elapsed.Seconds(), got)
			if len(failures) > 0 {
				t.Fatalf("%d of %d queries failed; first: %s", len(failures), queries, failures[0])
			}
			if got["198.18.9.1"] != 200 || got["198.18.9.2"] != 100 {
				t.Errorf("answers %v, want 200 from a and 100 from b", got)
			}
			st := w.waitStatus(5*time.Second, "the dig sessions ended", func(st api.Status) bool {
				return st.UDP.EndedResponses-before.EndedResponses == queries
			})
			u := st.UDP
			if u.Created-before.Created != queries || u.DatagramsIn-before.DatagramsIn != queries || u.DatagramsOut-before.DatagramsOut != queries {
				t.Errorf("udp status %+v (before %+v)", u, before)
			}
			if _, by := pickedSum(st, "dns-"+ipv.name); by["a-"+ipv.name] < 200 || by["b-"+ipv.name] < 100 {
				t.Errorf("picked %v", by)
			}
			t.Logf("udp: %d bytes in, %d out over %d sessions", u.BytesIn-before.BytesIn, u.BytesOut-before.BytesOut, queries)
			// Each answer's latency is measured at its target: 200 and 100.
			for _, s := range st.Services {
				if s.Name != "dns-"+ipv.name {
					continue
				}
				for _, tg := range s.Targets {
					want := map[string]uint64{"a-" + ipv.name: 200, "b-" + ipv.name: 100}[tg.Name]
					r := tg.Replies
					if r == nil || r.Total.Replies != want || r.Total.P50 <= 0 || r.Total.P99 < r.Total.P50 || r.Total.P99 >= 2000 {
						t.Errorf("target %s: replies %+v, want %d with 0 < p50 <= p99 < udp.responseTimeout", tg.Name, r, want)
						continue
					}
					t.Logf("target %s: %d replies, p50 %.3f ms, p99 %.3f ms", tg.Name, r.Total.Replies, r.Total.P50, r.Total.P99)
				}
			}

			// Queries/s through weir beside the kernel's (straight to a
			// target), Go clients, a new socket per query.
			const burst, conc = 2000, 16
			viaOK, viaT := w.dnsBurst(ipv.vip(53, 53), burst, conc)
			kOK, kT := w.dnsBurst(ipv.target(1, 5353), burst, conc)
			viaQPS, kQPS := float64(viaOK)/viaT.Seconds(), float64(kOK)/kT.Seconds()
			t.Logf("%d queries, %d at a time, a new socket each: through weir %d answered, %.0f queries/s; straight to dnsmasq %d answered, %.0f queries/s (%.2fx; load average %s)",
				burst, conc, viaOK, viaQPS, kOK, kQPS, viaQPS/kQPS, loadAverage())
			if viaOK < burst*995/1000 {
				t.Errorf("through weir %d of %d answered", viaOK, burst)
			}

			// maxConnections 3: four clients, each its own socket (port).
			vip := netip.MustParseAddrPort(ipv.vip(54, 53))
			clients := make([]*net.UDPConn, 4)
			for i := range clients {
				if err := w.ns.Do(func() (err error) { clients[i], err = net.ListenUDP("udp", nil); return err }); err != nil {
					t.Fatal(err)
				}
				if err := recvTOS(clients[i]); err != nil {
					t.Fatal(err)
				}
				defer clients[i].Close()
			}
			ask := func(i int, wait time.Duration) (netip.Addr, error) {
				a, from, tos, err := dnsAskTOS(clients[i], vip, uint16(0x100+i), wait)
				if from = netip.AddrPortFrom(from.Addr().Unmap(), from.Port()); err == nil && from != vip {
					t.Errorf("client %d: reply from %v, not the VIP %v", i, from, vip)
				}
				if err == nil && tos != 0xb8 { // the capped-ef rule's dnsEF
					t.Errorf("client %d: reply ToS %#x, want 0xb8 (rule capped-ef)", i, tos)
				}
				return a, err
			}
			refused := w.status().UDP.Refused
			for i := range 3 {
				if a, err := ask(i, 5*time.Second); err != nil || a.String() != "198.18.9.3" {
					t.Fatalf("client %d: %v %v", i, a, err)
				}
			}
			if _, err := ask(3, 500*time.Millisecond); err == nil {
				t.Fatal("a fourth session answered at maxConnections 3")
			}
			w.waitStatus(5*time.Second, "the fourth session's datagram counted as refused", func(st api.Status) bool {
				return st.UDP.Refused > refused
			})
			for i := range 3 { // the three sessions go on
				if _, err := ask(i, 5*time.Second); err != nil {
					t.Fatalf("client %d's open session: %v", i, err)
				}
			}
			w.waitStatus(10*time.Second, "the idle timeout to end the three sessions", func(st api.Status) bool {
				return st.UDP.Sessions == 0
			})
			if a, err := ask(3, 5*time.Second); err != nil || a.String() != "198.18.9.3" {
				t.Fatalf("the fourth client after the idle timeout: %v %v", a, err)
			}
		})
	}
}

// TestE2EUDPDeadTarget: a DNS target whose server hangs (stopped with
// SIGSTOP: its socket stays open, so no ICMP tells weir) loses the queries
// it gets until its unanswered ratio (sessions with no reply within
// udp.responseTimeout) crosses the timeout threshold; then its weight is
// cut to 0 (the reaction time is logged). The live target's queries are
// all answered throughout.
func TestE2EUDPDeadTarget(t *testing.T) {
	w := startWeir(t, "udp-dead.yaml")
	w.dnsmasq("198.18.9.1", "198.18.1.1")
	b := w.dnsmasq("198.18.9.2", "198.18.1.2")
	vip := "198.18.0.55:53"
	if ok, _ := w.dnsBurst(vip, 40, 4); ok != 40 {
		t.Fatalf("before: %d of 40 answered", ok)
	}
	if err := b.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	effective := func(st api.Status) int {
		for _, tg := range statusService(st, "dns").Targets {
			if tg.Name == "b" {
				return tg.Effective
			}
		}
		return -1
	}
	// Queries keep coming while the monitor judges: half go to b and are
	// lost until its weight is cut.
	var lost, sent atomic.Int64
	stop := make(chan struct{})
	var load sync.WaitGroup
	load.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			ok, _ := w.dnsBurstWait(vip, 32, 32, time.Second)
			sent.Add(32)
			lost.Add(int64(32 - ok))
		}
	})
	var reaction time.Duration
	cut := testutil.WithinEvery(10*time.Second, 20*time.Millisecond, func() bool {
		reaction = time.Since(stopped)
		return effective(w.status()) == 0
	})
	close(stop)
	load.Wait()
	if !cut {
		tg := statusService(w.status(), "dns").Targets[1]
		t.Fatalf("b's weight not cut %v after it stopped answering: %+v\nexplanation %+v\nudp %+v", reaction, tg, tg.Explanation, w.status().UDP)
	}
	t.Logf("b cut %v after it stopped answering (sampling 1 s, response timeout 500 ms); %d of %d queries lost meanwhile", reaction.Round(10*time.Millisecond), lost.Load(), sent.Load())
	if l, s := lost.Load(), sent.Load(); l > s/2+s/10 {
		t.Errorf("%d of %d queries lost: more than b's share", l, s)
	}
	if st := w.status(); st.UDP.EndedUnanswered == 0 {
		t.Errorf("no unanswered session counted: %+v", st.UDP)
	}
}

// loadAverage is the machine's 1-minute load average as /proc/loadavg
// reads, for the figures a test logs ("?" where it cannot be read).
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) > 0 {
		return f[0]
	}
	return "?"
}
