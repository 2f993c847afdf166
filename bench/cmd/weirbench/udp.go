package main

// The UDP test (udp1): iperf3 -u, one stream, client → server at -udp-rate
// with udpLen-byte datagrams, through the kernel, through weir's udp
// service on the VIP (weirConfig) and through a peer. The figure is the
// receiver's throughput, with the receiver's loss beside it: a path slower
// than the offered rate shows it as loss. Through weir the harness also
// reads /status before and after each run: the stream must be one session
// given to one target (a session per client address and port, never
// balanced per datagram), and weir's own counters say where the datagrams
// went (relayed, dropped by the VIP endpoint's full receive buffer).
// HAProxy and kproxy balance TCP only: their cells say so.
//
// The sessions are counted while the stream runs, shortly before the
// client stops: at the end of a test iperf3's server closes its socket,
// and the datagrams weir still holds then (a path slower than the offered
// rate holds a queue) meet ICMP port unreachable, which ends the session;
// each of those datagrams after it starts a session of its own. Those are
// counted apart (TrailingSessions), not as the stream's.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/vishvananda/netlink"

	"weir/internal/netns"
)

// udpService is the name of weir's udp service in the harness's config.
const udpService = "iperf-udp"

// udpWindow is iperf3 -u's socket buffers (-w), the server's receive
// buffer among them (up to net.core.rmem_max): the default 208 KiB holds
// some 90 datagrams, which a burst overflows whenever the server waits for
// a CPU, on every path; the loss would then measure the server's
// scheduling, not the path.
const udpWindow = "4M"

// udpResult is one iperf3 -u run.
type udpResult struct {
	Gbps     float64 `json:"gbps"`      // the receiver's
	SentGbps float64 `json:"sent_gbps"` // the sender's
	Bytes    int64   `json:"bytes"`     // the receiver got
	// Packets the sender sent, and of those the receiver lost (sequence
	// gaps at the end of the run), in per cent too.
	Packets     int64   `json:"packets"`
	Lost        int64   `json:"lost_packets"`
	LostPercent float64 `json:"lost_percent"`
	JitterMs    float64 `json:"jitter_ms"`
	// Weir's side of the run (zero for the other paths): sessions it
	// created, the targets it gave them to, datagrams it relayed to the
	// target and replies back, and datagrams its VIP endpoint dropped with
	// its receive buffer full (the loss inside weir before the relay).
	Sessions uint64 `json:"weir_sessions,omitempty"`
	// TrailingSessions: sessions made after the stream's end, from the
	// datagrams weir held when the server closed its socket.
	TrailingSessions uint64         `json:"weir_trailing_sessions,omitempty"`
	Picked           map[string]int `json:"weir_picked,omitempty"`
	DatagramsIn      uint64         `json:"weir_datagrams_in,omitempty"`
	DatagramsOut     uint64         `json:"weir_datagrams_out,omitempty"`
	ReceiveDropped   uint64         `json:"weir_receive_dropped,omitempty"`
	WriteErrors      uint64         `json:"weir_write_errors,omitempty"`
	// TUNDropped: datagrams the router's kernel dropped with weir's TUN
	// queue full (weir read too slowly); ServerRcvbuf: datagrams the
	// server's kernel dropped with iperf3's socket buffer full (every
	// path): where the loss is, beside iperf3's own count.
	TUNDropped   uint64 `json:"weir_tun_dropped,omitempty"`
	ServerRcvbuf uint64 `json:"server_rcvbuf_errors"`
}

// iperfUDP runs iperf3 -u's client in the client namespace against addr.
func iperfUDP(ctx context.Context, topo *topology, addr string, d time.Duration, rate string) (udpResult, error) {
	secs := max(int(d/time.Second), 1)
	argv := []string{"iperf3", "-c", addr, "-p", strconv.Itoa(iperfPort), "-u", "-b", rate, "-l", strconv.Itoa(udpLen),
		"-w", udpWindow, "-t", strconv.Itoa(secs), "-J", "--connect-timeout", "3000"}
	for attempt := 0; ; attempt++ {
		rctx, cancel := context.WithTimeout(ctx, time.Duration(secs)*time.Second+30*time.Second)
		out, err := runIn(rctx, topo.client, argv...)
		cancel()
		r, perr := parseIperfUDP(out)
		// The server answers "busy" while it still winds the last test down.
		if perr != nil && strings.Contains(perr.Error(), "busy") && attempt < 3 {
			time.Sleep(time.Second)
			continue
		}
		if perr != nil {
			return r, errors.Join(perr, err)
		}
		return r, nil
	}
}

// parseIperfUDP reads iperf3 -u's -J output: the receiver's total (with
// its loss) and the sender's rate.
func parseIperfUDP(out []byte) (udpResult, error) {
	type sum struct {
		Bytes         float64 `json:"bytes"`
		BitsPerSecond float64 `json:"bits_per_second"`
		JitterMs      float64 `json:"jitter_ms"`
		LostPackets   int64   `json:"lost_packets"`
		Packets       int64   `json:"packets"`
		LostPercent   float64 `json:"lost_percent"`
	}
	var r struct {
		Error string `json:"error"`
		Start struct {
			TestStart struct {
				Protocol string `json:"protocol"`
			} `json:"test_start"`
		} `json:"start"`
		End struct {
			SumSent     sum `json:"sum_sent"`
			SumReceived sum `json:"sum_received"`
		} `json:"end"`
	}
	if err := json.Unmarshal(out, &r); err != nil {
		return udpResult{}, fmt.Errorf("iperf3 output: %w", err)
	}
	if r.Error != "" {
		return udpResult{}, fmt.Errorf("iperf3: %s", r.Error)
	}
	if r.Start.TestStart.Protocol != "UDP" {
		return udpResult{}, fmt.Errorf("iperf3: a %q test, not UDP", r.Start.TestStart.Protocol)
	}
	rx := r.End.SumReceived
	if rx.Bytes <= 0 {
		return udpResult{}, errors.New("iperf3: nothing received")
	}
	return udpResult{Gbps: rx.BitsPerSecond / 1e9, SentGbps: r.End.SumSent.BitsPerSecond / 1e9, Bytes: int64(rx.Bytes),
		Packets: rx.Packets, Lost: rx.LostPackets, LostPercent: rx.LostPercent, JitterMs: rx.JitterMs}, nil
}

// runUDP runs iperfUDP on p and reads the server's UDP receive-buffer
// drops around it; through weir it also reads /status before the run,
// near the stream's end (udpCheckAt) and after the run, and the drops of
// weir's TUN queue.
func runUDP(ctx context.Context, topo *topology, o options, p *path) (udpResult, error) {
	rcv0, err := rcvbufErrors(topo.server)
	if err != nil {
		return udpResult{}, err
	}
	u, err := runUDPOn(ctx, topo, o, p)
	if rcv1, rerr := rcvbufErrors(topo.server); rerr == nil {
		u.ServerRcvbuf = rcv1 - rcv0
	} else if err == nil {
		err = rerr
	}
	return u, err
}

func runUDPOn(ctx context.Context, topo *topology, o options, p *path) (udpResult, error) {
	if p.admin == nil {
		return iperfUDP(ctx, topo, p.Addr, o.IperfTime, o.UDPRate)
	}
	var st0, stMid, st1 weirStatus
	if err := p.admin.status(ctx, &st0); err != nil {
		return udpResult{}, err
	}
	tun0, err := tunTxDropped(topo.router)
	if err != nil {
		return udpResult{}, err
	}
	type result struct {
		u   udpResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		u, err := iperfUDP(ctx, topo, p.Addr, o.IperfTime, o.UDPRate)
		done <- result{u, err}
	}()
	var midErr error
	select {
	case r := <-done: // over before the check: it failed
		return r.u, errors.Join(r.err, errors.New("iperf3 -u ended before the session check"))
	case <-time.After(udpCheckAt(o.IperfTime)):
		midErr = p.admin.status(ctx, &stMid)
	}
	r := <-done
	if r.err != nil {
		return r.u, r.err
	}
	if midErr != nil {
		return r.u, midErr
	}
	if err := p.admin.status(ctx, &st1); err != nil {
		return r.u, err
	}
	tun1, err := tunTxDropped(topo.router)
	if err != nil {
		return r.u, err
	}
	r.u.TUNDropped = tun1 - tun0
	return r.u, r.u.weirSide(st0, stMid, st1)
}

// rcvbufErrors is Udp RcvbufErrors of ns's kernel (/proc/thread-self/net:
// /proc/net is the main thread's namespace, not the one ns.Do entered).
func rcvbufErrors(ns *netns.NS) (uint64, error) {
	var b []byte
	err := ns.Do(func() (err error) {
		b, err = os.ReadFile("/proc/thread-self/net/snmp")
		return err
	})
	if err != nil {
		return 0, err
	}
	return snmpValue(string(b), "Udp", "RcvbufErrors")
}

// snmpValue reads one counter of a /proc/net/snmp text: a header line and
// a value line per protocol.
func snmpValue(text, proto, name string) (uint64, error) {
	var head []string
	for _, line := range strings.Split(text, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != proto+":" {
			continue
		}
		if head == nil {
			head = f
			continue
		}
		for i, h := range head {
			if h == name && i < len(f) {
				return strconv.ParseUint(f[i], 10, 64)
			}
		}
		break
	}
	return 0, fmt.Errorf("snmp: no %s %s", proto, name)
}

// tunTxDropped is what the router's kernel dropped toward weir's TUN (its
// transmit queue full).
func tunTxDropped(ns *netns.NS) (uint64, error) {
	var n uint64
	err := ns.Do(func() error {
		l, err := netlink.LinkByName(weirTUN)
		if err != nil {
			return err
		}
		if st := l.Attrs().Statistics; st != nil {
			n = st.TxDropped
		}
		return nil
	})
	return n, err
}

// udpCheckAt is when, after the client starts, the stream's sessions are
// counted: a quarter of the run (at most a second) before its end.
func udpCheckAt(run time.Duration) time.Duration {
	run = max(run.Truncate(time.Second), time.Second)
	return run - min(run/4, time.Second)
}

// weirSide fills u's weir figures from /status before the run, near the
// stream's end (mid) and after the run, and checks that the stream was one
// session on one target.
func (u *udpResult) weirSide(before, mid, after weirStatus) error {
	b, a := before.UDP, after.UDP
	u.Sessions = mid.UDP.Created - b.Created
	u.TrailingSessions = a.Created - mid.UDP.Created
	u.DatagramsIn, u.DatagramsOut = a.DatagramsIn-b.DatagramsIn, a.DatagramsOut-b.DatagramsOut
	u.ReceiveDropped, u.WriteErrors = a.ReceiveDropped-b.ReceiveDropped, a.WriteErrors-b.WriteErrors
	picked := func(st weirStatus) map[string]uint64 {
		m := map[string]uint64{}
		for _, s := range st.Services {
			if s.Name == udpService {
				for _, t := range s.Targets {
					m[t.Name] = t.Picked
				}
			}
		}
		return m
	}
	pb := picked(before)
	u.Picked = map[string]int{}
	total := 0
	for name, n := range picked(mid) {
		if d := int(n - pb[name]); d > 0 {
			u.Picked[name] = d
			total += d
		}
	}
	if u.Sessions != 1 || total != 1 {
		return fmt.Errorf("one iperf3 -u stream made %d weir sessions while it ran, picked %v: want one session on one target", u.Sessions, u.Picked)
	}
	return nil
}

// weirStatus is the part of weir's /status document (cmd/weir/api.Status)
// the UDP test reads. The harness links none of weir's packages (the
// design's import rules), so it decodes the fields it needs by their JSON
// names; TestWeirStatusDecodes pins them to api.Status.
type weirStatus struct {
	UDP struct {
		Created        uint64 `json:"created"`
		DatagramsIn    uint64 `json:"datagrams_in"`
		DatagramsOut   uint64 `json:"datagrams_out"`
		ReceiveDropped uint64 `json:"receive_dropped"`
		WriteErrors    uint64 `json:"write_errors"`
	} `json:"udp"`
	Services []struct {
		Name    string `json:"name"`
		Targets []struct {
			Name   string `json:"name"`
			Picked uint64 `json:"picked"`
		} `json:"targets"`
	} `json:"services"`
}

// status reads weir's /status into st.
func (a *admin) status(ctx context.Context, st *weirStatus) error {
	b, err := a.get(ctx, "/status", 10*time.Second)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, st)
}
