//go:build linux

package main

import (
	"encoding/binary"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"golang.org/x/sys/unix"
)

// capturedPacket is one IPv4/TCP packet seen on weir0.
type capturedPacket struct {
	outgoing bool // sent by the kernel into the TUN (client → weir)
	ip       *layers.IPv4
	tcp      *layers.TCP
}

// capture reads every packet on the namespace's weir0 with an AF_PACKET
// socket until stop is called, which returns what it saw.
func (w *weirProc) capture(t *testing.T) (stop func() []capturedPacket) {
	t.Helper()
	htons := func(v uint16) uint16 { return v<<8 | v>>8 }
	var fd int
	if err := w.ns.do(func() error {
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
			p := gopacket.NewPacket(append([]byte(nil), buf[:n]...), layers.LayerTypeIPv4, gopacket.NoCopy)
			ip, _ := p.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
			tcp, _ := p.Layer(layers.LayerTypeTCP).(*layers.TCP)
			if ip == nil || tcp == nil {
				continue
			}
			mu.Lock()
			pkts = append(pkts, capturedPacket{outgoing: ll != nil && ll.Pkttype == unix.PACKET_OUTGOING, ip: ip, tcp: tcp})
			mu.Unlock()
		}
	}()
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
	return stop
}

// TestE2ETOSMarking: the telnet rule's OutgoingTOS 10100000 is on every
// packet the client receives from the VIP's port 23, the SYN-ACK included;
// the service no rule matches keeps ToS 0. The packets are captured on the
// client side of the TUN.
func TestE2ETOSMarking(t *testing.T) {
	w := startWeir(t, "tos.yaml")
	w.echo("198.18.1.3:2323")
	stop := w.capture(t)
	for _, vip := range []string{"198.18.0.23:23", "198.18.0.24:2424"} {
		for i := 0; i < 3; i++ {
			c, err := w.echoOnce(vip)
			if err != nil {
				t.Fatalf("%s: %v", vip, err)
			}
			c.Close()
		}
	}
	// Let the FIN exchanges finish before the capture stops.
	time.Sleep(300 * time.Millisecond)
	pkts := stop()

	type seen struct{ packets, synAcks, fins, data, wrongTOS int }
	var marked, plain seen
	var bad []string
	for _, p := range pkts {
		if p.outgoing {
			continue
		}
		var s *seen
		var want uint8
		switch {
		case p.ip.SrcIP.Equal(net.IPv4(198, 18, 0, 23)) && p.tcp.SrcPort == 23:
			s, want = &marked, 0xA0
		case p.ip.SrcIP.Equal(net.IPv4(198, 18, 0, 24)) && p.tcp.SrcPort == 2424:
			s, want = &plain, 0
		default:
			continue
		}
		s.packets++
		if p.tcp.SYN && p.tcp.ACK {
			s.synAcks++
		}
		if p.tcp.FIN {
			s.fins++
		}
		if len(p.tcp.Payload) > 0 {
			s.data++
		}
		if p.ip.TOS != want {
			s.wrongTOS++
			if len(bad) < 10 {
				bad = append(bad, p.ip.SrcIP.String()+":"+p.tcp.SrcPort.String()+" flags "+tcpFlags(p.tcp)+
					" tos 0x"+hex8(p.ip.TOS)+" want 0x"+hex8(want))
			}
		}
		// The IPv4 header checksum must still hold after the rewrite.
		if sum := ipv4Checksum(p.ip.Contents); sum != 0 {
			t.Errorf("packet from %s:%d: bad IPv4 header checksum after marking", p.ip.SrcIP, p.tcp.SrcPort)
		}
	}
	t.Logf("captured %d packets; from :23 %+v; from :2424 %+v", len(pkts), marked, plain)
	if marked.synAcks != 3 || marked.data < 3 || marked.fins < 3 {
		t.Errorf("from 198.18.0.23:23: %+v, want 3 SYN-ACKs, ≥ 3 data packets and ≥ 3 FINs", marked)
	}
	if plain.synAcks != 3 || plain.data < 3 {
		t.Errorf("from 198.18.0.24:2424: %+v, want 3 SYN-ACKs and ≥ 3 data packets", plain)
	}
	if marked.wrongTOS != 0 || plain.wrongTOS != 0 {
		t.Errorf("packets with the wrong ToS: %v", bad)
	}
	// The datapath counted what it marked.
	ds, _ := w.status().Datapath.(map[string]any)
	if m, _ := ds["Marked"].(float64); int(m) < marked.packets {
		t.Errorf("datapath Marked %v, fewer than the %d marked packets captured", ds["Marked"], marked.packets)
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

func hex8(b uint8) string {
	const digits = "0123456789abcdef"
	return string([]byte{digits[b>>4], digits[b&15]})
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
