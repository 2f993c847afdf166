package pcapdev

import (
	"bytes"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/google/gopacket/pcapgo"

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

	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r, err := pcapgo.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
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
