package netstack_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"

	"weir/datapath"
	"weir/netstack"
	"weir/netstack/proxy"
	"weir/policy"
)

// acceptAll admits every connection to one target; it is its own Session,
// holding nothing per connection.
type acceptAll struct{ target *policy.Target }

func (a acceptAll) Admit(*proxy.ConnRequest) (proxy.Decision, proxy.Session) {
	return proxy.Decision{Verdict: proxy.Accept, Target: a.target}, a
}

// DialFailed gives up at the first failed dial.
func (acceptAll) DialFailed(proxy.Decision, error) proxy.Decision {
	return proxy.Decision{Verdict: proxy.RefuseRST}
}

// TargetFailed would mark the target down for a while.
func (acceptAll) TargetFailed(proxy.Decision, error) {}
func (acceptAll) Spliced(int64)                      {}

// Released would give the connection's slots back as soon as the client is
// done with it.
func (acceptAll) Released() {}

// End would release what Admit reserved and write the access log.
func (acceptAll) End(*proxy.End) {}

// A client stack dials a VIP over an in-memory pair; weir's stack answers for
// the VIP and splices the connection to a host echo server.
func ExampleNewForwarder() {
	echo, _ := net.Listen("tcp4", "127.0.0.1:0")
	defer echo.Close()
	go func() {
		c, err := echo.Accept()
		if err == nil {
			io.Copy(c, c)
			c.Close()
		}
	}()

	vip := netip.MustParseAddrPort("198.19.0.80:80")
	target := &policy.Target{Name: "echo-1", Addr: echo.Addr().(*net.TCPAddr).AddrPort(), Weight: 1}
	// Compile fills the virtual server's timeouts the forwarder uses.
	cfg, err := policy.Compile(&policy.Config{Services: []*policy.VirtualServer{{
		Name: "echo", VIPs: []netip.Addr{vip.Addr()}, Ports: policy.PortRange{Lo: 80, Hi: 80},
		Targets: []*policy.Target{target},
	}}})
	if err != nil {
		fmt.Println(err)
		return
	}

	weirEnd, clientEnd := datapath.NewPipe(datapath.PipeOptions{})
	weir, _ := netstack.New(netstack.Options{})
	defer weir.Close()
	weir.AddNIC(weirEnd, netstack.NICOptions{Promiscuous: true})
	// The forwarder accepts; the proxy admits, dials and splices.
	px := proxy.New(proxy.Options{Admitter: acceptAll{target}, Host: &netstack.HostDialer{}})
	fwd := netstack.NewForwarder(weir, netstack.ForwarderOptions{
		Services: cfg.TCPService,
		Handler:  px,
	})
	defer fwd.Close() // closes px too

	client, _ := netstack.New(netstack.Options{})
	defer client.Close()
	client.AddNIC(clientEnd, netstack.NICOptions{Addrs: []netip.Prefix{netip.MustParsePrefix("198.18.0.2/15")}})
	c, err := client.DialTCP(context.Background(), netip.AddrPort{}, vip)
	if err != nil {
		fmt.Println(err)
		return
	}
	io.WriteString(c, "hello")
	c.CloseWrite()
	b, _ := io.ReadAll(c)
	c.Close()
	fmt.Printf("%s, accepted %d\n", b, px.Stats().Accepted)
	// Output: hello, accepted 1
}
