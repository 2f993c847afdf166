package pcapdev

import (
	"bytes"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"weir/datapath"
)

func ipPacket(t *testing.T, v6 bool, sport uint16) []byte {
	t.Helper()
	buf := gopacket.NewSerializeBuffer()
	opts := gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}
	u := &layers.UDP{SrcPort: layers.UDPPort(sport), DstPort: 9999}
	var err error
	if v6 {
		ip := &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: layers.IPProtocolUDP, SrcIP: net.ParseIP("fd00::2"), DstIP: net.ParseIP("fd00::1")}
		u.SetNetworkLayerForChecksum(ip)
		err = gopacket.SerializeLayers(buf, opts, ip, u, gopacket.Payload("hello"))
	} else {
		ip := &layers.IPv4{Version: 4, IHL: 5, TTL: 64, Protocol: layers.IPProtocolUDP, SrcIP: net.IP{198, 18, 0, 2}, DstIP: net.IP{198, 18, 0, 1}}
		u.SetNetworkLayerForChecksum(ip)
		err = gopacket.SerializeLayers(buf, opts, ip, u, gopacket.Payload("hello"))
	}
	if err != nil {
		t.Fatal(err)
	}
	return append([]byte(nil), buf.Bytes()...)
}

func TestRecorderWritesWiresharkReadableCapture(t *testing.T) {
	a, b := datapath.NewPipe(datapath.PipeOptions{})
	path := filepath.Join(t.TempDir(), "weir.pcap")
	clock := time.Unix(1_700_000_000, 0)
	c, err := CreateCapture(path, CaptureOptions{Now: func() time.Time { clock = clock.Add(time.Millisecond); return clock }})
	if err != nil {
		t.Fatal(err)
	}
	rec := c.Wrap(a)
	out := [][]byte{ipPacket(t, false, 1), ipPacket(t, true, 2), ipPacket(t, false, 3)}
	in := [][]byte{ipPacket(t, true, 4), ipPacket(t, false, 5)}
	if _, err := rec.Write(out, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Write(in, 0); err != nil {
		t.Fatal(err)
	}
	bufs := [][]byte{make([]byte, 1500), make([]byte, 1500)}
	sizes := make([]int, 2)
	if n, err := rec.Read(bufs, sizes, 0); n != 2 || err != nil {
		t.Fatalf("Read = %d, %v", n, err)
	}
	if err := rec.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if st := c.Stats(); st.Recorded != 5 || st.Missed != 0 {
		t.Errorf("Stats = %+v, want 5 recorded", st)
	}

	r := openCapture(t, path)
	if r.LinkType() != layers.LinkTypeRaw {
		t.Fatalf("link type %v, want RAW", r.LinkType())
	}
	want := append(append([][]byte{}, out...), in...)
	var last time.Time
	for i, w := range want {
		data, ci, err := r.ReadPacketData()
		if err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
		if !bytes.Equal(data, w) {
			t.Errorf("record %d differs", i)
		}
		if !ci.Timestamp.After(last) {
			t.Errorf("record %d timestamp %v not after %v", i, ci.Timestamp, last)
		}
		last = ci.Timestamp
		// gopacket decodes it as Wireshark would: RAW → IPv4/IPv6 → UDP.
		p := gopacket.NewPacket(data, layers.LinkTypeRaw, gopacket.Default)
		if p.ErrorLayer() != nil || p.Layer(layers.LayerTypeUDP) == nil {
			t.Errorf("record %d does not decode as IP/UDP: %v", i, p.ErrorLayer())
		}
	}
	if _, _, err := r.ReadPacketData(); err == nil {
		t.Error("more records than packets")
	}
}

// TestCaptureSnaplenAndTimestamps: a packet longer than Snaplen is cut
// there and keeps its length; timestamps keep their nanoseconds; tcpdump
// (when installed: scripts/deps.sh) reads the file as it would any other.
func TestCaptureSnaplenAndTimestamps(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cut.pcap")
	at := time.Unix(1_700_000_000, 123_456_789)
	c, err := CreateCapture(path, CaptureOptions{Snaplen: 30, Now: func() time.Time { return at }})
	if err != nil {
		t.Fatal(err)
	}
	a, _ := datapath.NewPipe(datapath.PipeOptions{})
	pkts := [][]byte{ipPacket(t, false, 1), ipPacket(t, true, 2)}
	if _, err := c.Wrap(a).Write(pkts, 0); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	r := openCapture(t, path)
	if r.Snaplen() != 30 {
		t.Errorf("snaplen %d, want 30", r.Snaplen())
	}
	for i, p := range pkts {
		data, ci, err := r.ReadPacketData()
		if err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
		if ci.CaptureLength != 30 || ci.Length != len(p) || !bytes.Equal(data, p[:30]) {
			t.Errorf("record %d: captured %d of %d, want 30 of %d", i, ci.CaptureLength, ci.Length, len(p))
		}
		if !ci.Timestamp.Equal(at) {
			t.Errorf("record %d: time %v, want %v", i, ci.Timestamp, at)
		}
	}
	if _, err := exec.LookPath("tcpdump"); err != nil {
		t.Log("no tcpdump here: the pcapgo reading above stands alone")
		return
	}
	out, err := exec.Command("tcpdump", "-nn", "-tt", "--nano", "-r", path).CombinedOutput()
	if err != nil {
		t.Fatalf("tcpdump -r: %v\n%s", err, out)
	}
	// The IPv6 packet's 30 bytes end inside its header: tcpdump says so
	// ("[|ip6]"), as it does for any short snap length.
	if n := strings.Count(string(out), "1700000000.123456789 "); n != 2 || !strings.Contains(string(out), "link-type RAW") ||
		!strings.Contains(string(out), "198.18.0.2.1 > 198.18.0.1.9999: UDP") {
		t.Errorf("tcpdump read %d records at the capture's time, want 2, the IPv4 one decoded:\n%s", n, out)
	}
}
