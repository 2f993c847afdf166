package pcapdev

import (
	"bytes"
	"errors"
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

func readAll(t *testing.T, d datapath.Device) [][]byte {
	t.Helper()
	var out [][]byte
	bufs := make([][]byte, 4)
	for i := range bufs {
		bufs[i] = make([]byte, 2000)
	}
	sizes := make([]int, 4)
	for range 1000 {
		n, err := d.Read(bufs, sizes, 0)
		for i := range n {
			out = append(out, append([]byte(nil), bufs[i][:sizes[i]]...))
		}
		if errors.Is(err, os.ErrClosed) {
			return out
		}
		if err != nil {
			t.Fatalf("Read: %v", err)
		}
	}
	t.Fatal("replay never ended")
	return nil
}

func TestRecorderWritesWiresharkReadableCapture(t *testing.T) {
	a, b := datapath.NewPipe(datapath.PipeOptions{})
	path := filepath.Join(t.TempDir(), "weir.pcap")
	clock := time.Unix(1_700_000_000, 0)
	rec, err := CreateRecorder(a, path, RecorderOptions{Now: func() time.Time { clock = clock.Add(time.Millisecond); return clock }})
	if err != nil {
		t.Fatal(err)
	}
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
	if rec.Recorded() != 5 {
		t.Errorf("Recorded = %d, want 5", rec.Recorded())
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

func writeCapture(t *testing.T, lt layers.LinkType, frames ...[]byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	w := pcapgo.NewWriter(&buf)
	if err := w.WriteFileHeader(65535, lt); err != nil {
		t.Fatal(err)
	}
	for i, f := range frames {
		ci := gopacket.CaptureInfo{Timestamp: time.Unix(int64(i), 0), CaptureLength: len(f), Length: len(f)}
		if err := w.WritePacket(ci, f); err != nil {
			t.Fatal(err)
		}
	}
	return buf.Bytes()
}

func ether(typ uint16, payload []byte) []byte {
	f := make([]byte, 14, 14+len(payload))
	f[12], f[13] = byte(typ>>8), byte(typ)
	return append(f, payload...)
}

func TestReplay(t *testing.T) {
	p4, p6 := ipPacket(t, false, 1), ipPacket(t, true, 2)
	vlan := append([]byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x81, 0x00, 0, 7, 0x08, 0x00}, p4...)
	sll := append(make([]byte, 14), append([]byte{0x86, 0xdd}, p6...)...)
	tests := []struct {
		name    string
		capture []byte
		opts    ReplayOptions
		want    [][]byte
		skipped uint64
		tooBig  uint64
	}{
		{"raw", writeCapture(t, layers.LinkTypeRaw, p4, p6), ReplayOptions{}, [][]byte{p4, p6}, 0, 0},
		{"ethernet skips arp", writeCapture(t, layers.LinkTypeEthernet, ether(0x0800, p4), ether(0x0806, make([]byte, 28)), ether(0x86dd, p6), vlan), ReplayOptions{}, [][]byte{p4, p6, p4}, 1, 0},
		{"linux sll", writeCapture(t, layers.LinkTypeLinuxSLL, sll), ReplayOptions{}, [][]byte{p6}, 0, 0},
		{"loops", writeCapture(t, layers.LinkTypeRaw, p4, p6), ReplayOptions{Loops: 2}, [][]byte{p4, p6, p4, p6, p4, p6}, 0, 0},
		{"mtu", writeCapture(t, layers.LinkTypeRaw, p4, make([]byte, 100)), ReplayOptions{MTU: 60}, [][]byte{p4}, 0, 1},
		{"empty", writeCapture(t, layers.LinkTypeRaw), ReplayOptions{}, nil, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, err := NewReplay(bytes.NewReader(tt.capture), tt.opts)
			if err != nil {
				t.Fatal(err)
			}
			got := readAll(t, d)
			if len(got) != len(tt.want) {
				t.Fatalf("replayed %d packets, want %d", len(got), len(tt.want))
			}
			for i := range got {
				if !bytes.Equal(got[i], tt.want[i]) {
					t.Errorf("packet %d differs", i)
				}
			}
			if d.Skipped() != tt.skipped || d.Stats().DroppedTooBig != tt.tooBig {
				t.Errorf("skipped %d, too big %d; want %d, %d", d.Skipped(), d.Stats().DroppedTooBig, tt.skipped, tt.tooBig)
			}
			if n, err := d.Write([][]byte{p4}, 0); n != 1 || err != nil {
				t.Errorf("Write = %d, %v", n, err)
			}
			d.Close()
			if _, err := d.Read(make([][]byte, 1), make([]int, 1), 0); !errors.Is(err, os.ErrClosed) {
				t.Errorf("Read after Close = %v", err)
			}
		})
	}
}

func TestReplayRejects(t *testing.T) {
	if _, err := NewReplay(bytes.NewReader([]byte("not a capture at all")), ReplayOptions{}); err == nil {
		t.Error("garbage accepted")
	}
	if _, err := NewReplay(bytes.NewReader(writeCapture(t, layers.LinkTypeIEEE802_11)), ReplayOptions{}); err == nil {
		t.Error("802.11 capture accepted")
	}
}

// TestRecordThenReplay records traffic through a recorder and replays the
// capture: the same packets come back.
func TestRecordThenReplay(t *testing.T) {
	a, _ := datapath.NewPipe(datapath.PipeOptions{})
	var buf bytes.Buffer
	rec, err := NewRecorder(a, &buf, RecorderOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pkts := [][]byte{ipPacket(t, false, 10), ipPacket(t, true, 11)}
	rec.Write(pkts, 0)
	rec.Close()
	d, err := NewReplay(&buf, ReplayOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got := readAll(t, d)
	if len(got) != 2 || !bytes.Equal(got[0], pkts[0]) || !bytes.Equal(got[1], pkts[1]) {
		t.Errorf("replayed %d packets, not the recorded ones", len(got))
	}
}
