package datapath_test

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"weir/datapath"
	"weir/policy"
)

func tcpSegment(src, dst netip.AddrPort, syn, ack bool) []byte {
	ip := &layers.IPv4{Version: 4, IHL: 5, TTL: 64, Protocol: layers.IPProtocolTCP,
		SrcIP: net.IP(src.Addr().AsSlice()), DstIP: net.IP(dst.Addr().AsSlice())}
	tcp := &layers.TCP{SrcPort: layers.TCPPort(src.Port()), DstPort: layers.TCPPort(dst.Port()), SYN: syn, ACK: ack, Window: 65535}
	tcp.SetNetworkLayerForChecksum(ip)
	buf := gopacket.NewSerializeBuffer()
	gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, ip, tcp)
	return buf.Bytes()
}

// An engine between a memory pair's end (standing for the network) and the
// stack: the client's SYN is parsed, classified and metered on the way in;
// the stack's SYN-ACK is marked with the matching action's ToS on the way
// out.
func ExampleEngine() {
	vip := netip.MustParseAddr("198.18.0.1")
	web := &policy.VirtualServer{Name: "web", VIPs: []netip.Addr{vip}, Ports: policy.PortRange{Lo: 80, Hi: 80}}
	gold := &policy.Action{Name: "gold", OutgoingTOS: 0b10100000, SetTOS: true}
	cfg, err := policy.Compile(&policy.Config{
		Services: []*policy.VirtualServer{web},
		Actions:  []*policy.Action{gold},
		Rules:    []*policy.Rule{{Name: "web", SrcPort: policy.PortRange{Lo: 80, Hi: 80}, Action: gold}},
	})
	if err != nil {
		panic(err)
	}
	network, inner := datapath.NewPipe(datapath.PipeOptions{})
	eng := datapath.NewEngine(inner, cfg, datapath.EngineOptions{})
	defer eng.Close()

	client := netip.MustParseAddrPort("198.18.0.2:40000")
	server := netip.AddrPortFrom(vip, 80)
	network.Write([][]byte{tcpSegment(client, server, true, false)}, 0)

	bufs, sizes := [][]byte{make([]byte, 1500)}, []int{0}
	n, _ := eng.Read(bufs, sizes, 0) // what the stack receives
	f := eng.Flow(client, server, datapath.ProtoTCP)
	fmt.Println("stack got", n, "packet; flow:", f.Service.Name, f.Action.Name)

	eng.Write([][]byte{tcpSegment(server, client, true, true)}, 0) // the stack's SYN-ACK
	network.Read(bufs, sizes, 0)
	var p datapath.Packet
	datapath.Parse(bufs[0][:sizes[0]], &p)
	fmt.Printf("client got ToS %#x\n", p.TOS)

	var tot datapath.MeterTotals
	eng.Meters().Totals(&tot)
	fmt.Println("web packets in/out:", tot.Services[0][datapath.Ingress].Packets, tot.Services[0][datapath.Egress].Packets)
	// Output:
	// stack got 1 packet; flow: web gold
	// client got ToS 0xa0
	// web packets in/out: 1 1
}
