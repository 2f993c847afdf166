//go:build linux

package e2e

import (
	"encoding/binary"
	"fmt"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"golang.org/x/sys/unix"

	"weir/internal/testutil"
)

// capturedPacket is one TCP packet seen on weir0.
type capturedPacket struct {
	outgoing bool // sent by the kernel into the TUN (client → weir)
	src      net.IP
	tos      uint8  // IPv4 ToS or IPv6 traffic class
	ip4      []byte // the IPv4 header; nil for IPv6
	tcp      *layers.TCP
}

// capture reads every packet on the namespace's weir0 with an AF_PACKET
// socket until stop is called, which returns what it saw; seen returns
// what it has seen so far.
func (w *weirProc) capture(t *testing.T) (seen, stop func() []capturedPacket) {
	t.Helper()
	htons := func(v uint16) uint16 { return v<<8 | v>>8 }
	var fd int
	if err := w.ns.Do(func() error {
		ifi, err := net.InterfaceByName("weir0")
		if err != nil {
			return err
		}
		fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM, int(htons(unix.ETH_P_ALL)))
		if err != nil {
			return err
		}
		if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: ifi.Index}); err != nil {
			unix.Close(fd)
			return err
		}
		return unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Usec: 50_000})
	}); err != nil {
		t.Fatalf("AF_PACKET capture on weir0: %v", err)
	}
	var (
		mu      sync.Mutex
		pkts    []capturedPacket
		quit    = make(chan struct{})
		stopped = make(chan struct{})
	)
	go func() {
		defer close(stopped)
		buf := make([]byte, 65536)
		for {
			select {
			case <-quit:
				return
			default:
			}
			n, from, err := unix.Recvfrom(fd, buf, 0)
			if err != nil {
				continue // EAGAIN every 50 ms: look at quit
			}
			ll, _ := from.(*unix.SockaddrLinklayer)
			if n == 0 {
				continue
			}
			// TUN frames are bare IP packets.
			first := layers.LayerTypeIPv4
			if buf[0]>>4 == 6 {
				first = layers.LayerTypeIPv6
			}
			p := gopacket.NewPacket(append([]byte(nil), buf[:n]...), first, gopacket.NoCopy)
			c := capturedPacket{outgoing: ll != nil && ll.Pkttype == unix.PACKET_OUTGOING}
			c.tcp, _ = p.Layer(layers.LayerTypeTCP).(*layers.TCP)
			if ip, ok := p.Layer(layers.LayerTypeIPv4).(*layers.IPv4); ok {
				c.src, c.tos, c.ip4 = ip.SrcIP, ip.TOS, ip.Contents
			} else if ip, ok := p.Layer(layers.LayerTypeIPv6).(*layers.IPv6); ok {
				c.src, c.tos = ip.SrcIP, ip.TrafficClass
			}
			if c.tcp == nil || c.src == nil {
				continue
			}
			mu.Lock()
			pkts = append(pkts, c)
			mu.Unlock()
		}
	}()
	seen = func() []capturedPacket {
		mu.Lock()
		defer mu.Unlock()
		return append([]capturedPacket(nil), pkts...)
	}
	var once sync.Once
	stop = func() []capturedPacket {
		once.Do(func() {
			close(quit)
			<-stopped
			unix.Close(fd)
		})
		mu.Lock()
		defer mu.Unlock()
		return pkts
	}
	t.Cleanup(func() { stop() })
	return seen, stop
}

// TestE2ETOSMarking: the telnet rule's OutgoingTOS 10100000 is on every
// packet the client receives from the VIP's port 23, the SYN-ACK included,
// over IPv4 (ToS, with a valid header checksum) and IPv6 (traffic class);
// the service no rule matches keeps 0. The packets are captured on the
// client side of the TUN.
func TestE2ETOSMarking(t *testing.T) {
	w := startWeir(t, "tos.yaml")
	w.echo("198.18.1.3:2323")
	soFar, stop := w.capture(t)
	const conns = 3
	for _, vip := range []string{"198.18.0.23:23", "198.18.0.24:2424", "[fd00::23]:23", "[fd00::24]:2424"} {
		for i := 0; i < conns; i++ {
			c, err := w.echoOnce(vip)
			if err != nil {
				t.Fatalf("%s: %v", vip, err)
			}
			c.Close()
		}
	}
	// Let the FIN exchanges finish before the capture stops: weir's FIN
	// toward every client seen (checked below), or 5 s.
	testutil.WithinEvery(5*time.Second, 20*time.Millisecond, func() bool {
		fins := map[string]int{}
		for _, p := range soFar() {
			if !p.outgoing && p.tcp.FIN {
				fins[net.JoinHostPort(p.src.String(), strconv.Itoa(int(p.tcp.SrcPort)))]++
			}
		}
		for _, vip := range []string{"198.18.0.23:23", "198.18.0.24:2424", "[fd00::23]:23", "[fd00::24]:2424"} {
			if fins[vip] < conns {
				return false
			}
		}
		return true
	})
	pkts := stop()

	type seen struct{ packets, synAcks, fins, data, wrongTOS int }
	from := map[string]*seen{}
	want := map[string]uint8{
		"198.18.0.23:23": 0xA0, "[fd00::23]:23": 0xA0,
		"198.18.0.24:2424": 0, "[fd00::24]:2424": 0,
	}
	var bad []string
	marked := 0
	for _, p := range pkts {
		if p.outgoing {
			continue
		}
		src := net.JoinHostPort(p.src.String(), strconv.Itoa(int(p.tcp.SrcPort)))
		wantTOS, ok := want[src]
		if !ok {
			continue
		}
		s := from[src]
		if s == nil {
			s = &seen{}
			from[src] = s
		}
		s.packets++
		if wantTOS != 0 {
			marked++
		}
		if p.tcp.SYN && p.tcp.ACK {
			s.synAcks++
		}
		if p.tcp.FIN {
			s.fins++
		}
		if len(p.tcp.Payload) > 0 {
			s.data++
		}
		if p.tos != wantTOS {
			s.wrongTOS++
			if len(bad) < 10 {
				bad = append(bad, fmt.Sprintf("%s flags %s tos %#02x, want %#02x", src, tcpFlags(p.tcp), p.tos, wantTOS))
			}
		}
		// The IPv4 header checksum must still hold after the rewrite.
		if p.ip4 != nil && ipv4Checksum(p.ip4) != 0 {
			t.Errorf("packet from %s: bad IPv4 header checksum", src)
		}
	}
	for src := range want {
		s := from[src]
		if s == nil {
			t.Errorf("no packet from %s captured", src)
			continue
		}
		t.Logf("from %s: %+v", src, *s)
		if s.synAcks != conns || s.data < conns || s.fins < conns {
			t.Errorf("from %s: %+v, want %d SYN-ACKs, data and FINs", src, *s, conns)
		}
	}
	if len(bad) > 0 {
		t.Errorf("packets with the wrong ToS: %v", bad)
	}
	// The datapath counted what it marked.
	if m := w.status().Datapath.Marked; m < uint64(marked) {
		t.Errorf("datapath marked %d, fewer than the %d marked packets captured", m, marked)
	}
}

func tcpFlags(t *layers.TCP) string {
	s := ""
	for _, f := range []struct {
		on   bool
		name string
	}{{t.SYN, "S"}, {t.ACK, "A"}, {t.FIN, "F"}, {t.RST, "R"}, {t.PSH, "P"}} {
		if f.on {
			s += f.name
		}
	}
	return s
}

// ipv4Checksum is the ones' complement sum over an IPv4 header: 0 when its
// checksum field is right.
func ipv4Checksum(h []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(h); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(h[i:]))
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	return ^uint16(sum)
}
