package netstack

import (
	"bytes"
	"crypto/rand"
	"io"
	"net/netip"
	"testing"
	"time"

	"weir/internal/testutil"
	"weir/policy"
)

// TestSpliceHostTarget dials a VIP from a client stack through the memory
// pair; weir splices it to a host loopback echo server. Data must come back
// intact and both legs' counters must be plausible.
func TestSpliceHostTarget(t *testing.T) {
	for _, tc := range []struct {
		name   string
		vip    netip.Addr
		net    string
		listen string
	}{
		{"ipv4", vipV4, "tcp4", "127.0.0.1:0"},
		{"ipv6", vipV6, "tcp6", "[::1]:0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			taddr, stop := echoServer(t, tc.net, tc.listen)
			defer stop()
			vs := &policy.VirtualServer{Name: "echo", VIPs: []netip.Addr{tc.vip}, Ports: policy.PortRange{Lo: 80, Hi: 80}}
			target := &policy.Target{Name: "t1", Addr: taddr}
			adm := &testAdmitter{target: target, action: &policy.Action{Name: "gold"}, keep: true}
			r := newRig(t, rigOptions{fwd: fwdOptions{Services: services(vs), Admitter: adm}})

			c := dial(t, r.client, netip.AddrPortFrom(tc.vip, 80))
			msg := make([]byte, 1<<20)
			rand.Read(msg)
			go func() {
				c.Write(msg)
				c.CloseWrite()
			}()
			got, err := io.ReadAll(c)
			if err != nil {
				t.Fatalf("read: %v", err)
			}
			if !bytes.Equal(got, msg) {
				t.Fatalf("echo: got %d bytes, want %d identical", len(got), len(msg))
			}
			// While the connection closes, its record must be listed or
			// already reported.
			c.Close()
			testutil.Within(5*time.Second, func() bool { return adm.nClosed.Load() > 0 })
			if adm.nClosed.Load() != 1 {
				t.Fatalf("Closed called %d times, want 1", adm.nClosed.Load())
			}
			cs := adm.closedStats()[0]
			if cs.ClientLeg.BytesReceived != uint64(len(msg)) || cs.ClientLeg.BytesSent != uint64(len(msg)) {
				t.Errorf("client leg bytes %d/%d, want %d each way", cs.ClientLeg.BytesReceived, cs.ClientLeg.BytesSent, len(msg))
			}
			if cs.TargetLeg.BytesSent != uint64(len(msg)) {
				t.Errorf("target leg bytes sent %d, want %d", cs.TargetLeg.BytesSent, len(msg))
			}
			// 1 MiB needs at least 1 MiB / MSS segments each way.
			minSegs := uint64(len(msg) / 65536)
			if cs.ClientLeg.SegmentsSent < minSegs || cs.ClientLeg.SegmentsReceived < minSegs {
				t.Errorf("client leg segments %d sent / %d received, want ≥ %d", cs.ClientLeg.SegmentsSent, cs.ClientLeg.SegmentsReceived, minSegs)
			}
			// The host leg's counters come from TCP_INFO.
			if cs.TargetLeg.SegmentsSent < minSegs || cs.TargetLeg.SegmentsReceived == 0 || cs.TargetLeg.RTT <= 0 {
				t.Errorf("target leg (TCP_INFO) segments sent %d (want ≥ %d), received %d, RTT %v", cs.TargetLeg.SegmentsSent, minSegs, cs.TargetLeg.SegmentsReceived, cs.TargetLeg.RTT)
			}
			if cs.ClientLeg.RTT <= 0 || cs.ClientLeg.RTT > time.Second {
				t.Errorf("client leg RTT %v implausible", cs.ClientLeg.RTT)
			}
			if cs.Client.Addr() != clientAddr(tc.vip) || cs.VIP != netip.AddrPortFrom(tc.vip, 80) || cs.Target != "t1" || cs.Service != "echo" {
				t.Errorf("record names %+v", cs)
			}
			st := r.stats()
			if st.Accepted != 1 || st.Open != 0 {
				t.Errorf("stats %+v", st)
			}
			s := r.px.Sample()
			if len(s.Targets) != 1 || s.Targets[0].Service != "echo" || s.Targets[0].Name != "t1" || s.Targets[0].Closed != 1 || s.Targets[0].SegmentsSent < minSegs {
				t.Errorf("sample targets %+v", s.Targets)
			}
			if ta := s.TargetActions; len(ta) != 1 || ta[0].Service != "echo" || ta[0].Name != "t1" || ta[0].Action != "gold" ||
				ta[0].Closed != 1 || ta[0].SegmentsSent != s.Targets[0].SegmentsSent || ta[0].Bytes != 2*uint64(len(msg)) {
				t.Errorf("sample target actions %+v", ta)
			}
		})
	}
}

func clientAddr(vip netip.Addr) netip.Addr {
	if vip.Is4() {
		return clientV4.Addr()
	}
	return clientV6.Addr()
}
