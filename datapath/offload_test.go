package datapath

import (
	"bytes"
	"os"
	"testing"
)

// gsoDevice is an offload device double: Read returns its packets once,
// each with its virtio-net header before offset, then os.ErrClosed; Write
// records what it is given, header included.
type gsoDevice struct {
	hdrs    []VirtioNetHdr
	pkts    [][]byte
	done    bool
	written [][]byte // header + packet
}

func (d *gsoDevice) Read(bufs [][]byte, sizes []int, offset int) (int, error) {
	if d.done {
		return 0, os.ErrClosed
	}
	d.done = true
	n := min(len(bufs), len(d.pkts))
	for i := range n {
		d.hdrs[i].Encode(bufs[i][offset-VirtioNetHdrLen:])
		sizes[i] = copy(bufs[i][offset:], d.pkts[i])
	}
	return n, nil
}

func (d *gsoDevice) Write(bufs [][]byte, offset int) (int, error) {
	for _, b := range bufs {
		d.written = append(d.written, append([]byte(nil), b[offset-VirtioNetHdrLen:]...))
	}
	return len(bufs), nil
}
func (d *gsoDevice) BatchSize() int  { return 64 }
func (d *gsoDevice) MTU() int        { return 1500 }
func (d *gsoDevice) Close() error    { return nil }
func (d *gsoDevice) GSOMaxSize() int { return 65535 }

// TestSegments pins the segment arithmetic: payload 10 000 bytes cut at
// 1448 is 7 segments, each carrying the 40 header bytes again.
func TestSegments(t *testing.T) {
	pkt := tcp4(t, vip4, client4, 80, 40000, 0, false, true, 10000)
	var p Packet
	if Parse(pkt, &p) != DropNone {
		t.Fatal("parse")
	}
	hdr := make([]byte, VirtioNetHdrLen)
	tests := []struct {
		name      string
		h         VirtioNetHdr
		segs, len int
	}{
		{"plain", VirtioNetHdr{}, 1, 10040},
		{"checksum only", VirtioNetHdr{Flags: VirtioNetFNeedsCsum, CsumStart: 20, CsumOffset: 16}, 1, 10040},
		{"tso 1448", VirtioNetHdr{GSOType: VirtioNetGSOTCPv4, GSOSize: 1448, HdrLen: 40}, 7, 10000 + 7*40},
		{"tso ecn 1000", VirtioNetHdr{GSOType: VirtioNetGSOTCPv4 | VirtioNetGSOECN, GSOSize: 1000}, 10, 10000 + 10*40},
		{"gso size above payload", VirtioNetHdr{GSOType: VirtioNetGSOTCPv4, GSOSize: 20000}, 1, 10040},
		{"gso type, size zero", VirtioNetHdr{GSOType: VirtioNetGSOTCPv4}, 1, 10040},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.h.Encode(hdr)
			var back VirtioNetHdr
			back.Decode(hdr)
			if back != tt.h {
				t.Fatalf("decode(encode(%+v)) = %+v", tt.h, back)
			}
			segs, n := Segments(hdr, pkt, &p)
			if segs != tt.segs || n != tt.len {
				t.Errorf("Segments = %d, %d bytes; want %d, %d", segs, n, tt.segs, tt.len)
			}
		})
	}
	if segs, n := Segments(nil, pkt, &p); segs != 1 || n != 10040 {
		t.Errorf("Segments without header = %d, %d", segs, n)
	}
}

// TestEngineSuperPackets: through an offload device the engine meters a
// super-packet as the segments it stands for (exactly what the meters
// would read had the kernel cut it), creates one flow for a super-packet
// flow, rewrites the ToS once per super-packet, keeps each header with its
// packet when it compacts the batch over a dropped one, and passes the
// headers through Write unchanged.
func TestEngineSuperPackets(t *testing.T) {
	const mss = 1448
	tso := VirtioNetHdr{Flags: VirtioNetFNeedsCsum, GSOType: VirtioNetGSOTCPv4, GSOSize: mss, HdrLen: 40, CsumStart: 20, CsumOffset: 16}
	// Ingress: a bad packet first (compaction), then a 60 000-byte
	// super-packet (42 segments), then a plain ACK of the same flow.
	dev := &gsoDevice{
		hdrs: []VirtioNetHdr{{}, tso, {}},
		pkts: [][]byte{
			{0x45, 0, 0},
			tcp4(t, client4, vip4, 40000, 80, 0, false, true, 60000),
			tcp4(t, client4, vip4, 40000, 80, 0, false, true, 0),
		},
	}
	e := NewEngine(dev, testConfig(t), EngineOptions{})
	if got := GSOMaxSize(e); got != 65535 {
		t.Fatalf("engine GSOMaxSize = %d, want the device's 65535", got)
	}
	const off = 16
	bufs := makeBatch(3, 70000, off)
	sizes := make([]int, 3)
	n, err := e.Read(bufs, sizes, off)
	if err != nil || n != 2 {
		t.Fatalf("Read = %d, %v; want 2 packets", n, err)
	}
	var h VirtioNetHdr
	h.Decode(bufs[0][off-VirtioNetHdrLen:])
	if h != tso || sizes[0] != 60040 {
		t.Errorf("first packet after compaction: header %+v, %d bytes; want %+v, 60040", h, sizes[0], tso)
	}
	h.Decode(bufs[1][off-VirtioNetHdrLen:])
	if h != (VirtioNetHdr{}) {
		t.Errorf("second packet's header %+v, want zero", h)
	}
	segs := (60000 + mss - 1) / mss
	var tot MeterTotals
	e.Meters().Totals(&tot)
	if got, want := tot.Services[0][Ingress], (Counter{Packets: uint64(segs + 1), Bytes: uint64(60000 + segs*40 + 40)}); got != want {
		t.Errorf("www ingress = %+v, want %+v", got, want)
	}
	if got := e.Flows().Stats().Inserted; got != 1 {
		t.Errorf("flows inserted = %d, want 1", got)
	}

	// Egress: two super-packets of the flow (www is marked 0xa0).
	out := [][]byte{
		append(make([]byte, off), tcp4(t, vip4, client4, 80, 40000, 0, false, true, 30000)...),
		append(make([]byte, off), tcp4(t, vip4, client4, 80, 40000, 0, false, true, 2000)...),
	}
	tso.Encode(out[0][off-VirtioNetHdrLen:])
	tso.Encode(out[1][off-VirtioNetHdrLen:])
	if _, err := e.Write(out, off); err != nil {
		t.Fatal(err)
	}
	if len(dev.written) != 2 {
		t.Fatalf("device got %d packets, want 2", len(dev.written))
	}
	for i, w := range dev.written {
		h.Decode(w)
		if h != tso {
			t.Errorf("written packet %d: header %+v, want %+v", i, h, tso)
		}
		if got := tosOf(t, w[VirtioNetHdrLen:]); got != 0xa0 {
			t.Errorf("written packet %d: ToS %#x, want 0xa0", i, got)
		}
		if !bytes.Equal(w[VirtioNetHdrLen:], out[i][off:]) {
			t.Errorf("written packet %d differs from the one given", i)
		}
	}
	if got := e.Stats().Marked; got != 2 {
		t.Errorf("Marked = %d, want 2 (one per super-packet)", got)
	}
	e.Meters().Totals(&tot)
	eSegs := (30000+mss-1)/mss + (2000+mss-1)/mss
	if got, want := tot.Services[0][Egress], (Counter{Packets: uint64(eSegs), Bytes: uint64(32000 + eSegs*40)}); got != want {
		t.Errorf("www egress = %+v, want %+v", got, want)
	}
	if got := e.Flows().Stats().Inserted; got != 1 {
		t.Errorf("flows inserted after egress = %d, want 1", got)
	}
}

// TestEnginePlainDeviceIgnoresScratch: a device without offload gets its
// packets metered one each, whatever the bytes before offset hold.
func TestEnginePlainDeviceIgnoresScratch(t *testing.T) {
	e := NewEngine(&sinkDevice{}, testConfig(t), EngineOptions{})
	const off = 16
	b := append(make([]byte, off), tcp4(t, vip4, client4, 80, 40000, 0, false, true, 30000)...)
	(&VirtioNetHdr{GSOType: VirtioNetGSOTCPv4, GSOSize: 1000}).Encode(b[off-VirtioNetHdrLen:])
	if _, err := e.Write([][]byte{b}, off); err != nil {
		t.Fatal(err)
	}
	var tot MeterTotals
	e.Meters().Totals(&tot)
	if got := tot.Services[0][Egress].Packets; got != 1 {
		t.Errorf("egress packets = %d, want 1", got)
	}
}
