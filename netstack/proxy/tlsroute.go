package proxy

// TLS passthrough routed by server name
//
//	serve (a tls virtual server's connection, before Admit):
//	    read the ClientHello (tlshello.Read: the records carrying it, no
//	    byte more; at most tlshello.MaxHello, within the service's
//	    timeouts.handshake)
//	        ──► bad, oversized, cut short, too slow ──► RST        SNIRefused[reason]
//	    Options.RouteSNI(VIP, server name) ──► none ──► RST         SNIRefused["no-match"]
//	    ──► req.Service = the routed tls service, req.ServerName set
//	    ──► the client leg replays the ClientHello bytes first (helloClient),
//	        then Admit, dial and splice as for a tcp service: the target
//	        gets the client's bytes unchanged and terminates TLS itself.
//
// The connection is refused before admission: a client that sends no valid
// ClientHello takes no admission slot, no target connection, no session (so
// no access-log line: the counters say what was refused and why). Close
// ends a peek in progress (the client is Held meanwhile).

import (
	"net/netip"
	"sync"
	"time"

	"weir/netstack/proxy/tlshello"
	"weir/policy"
)

// SNI refusal reasons: tlshello.Reasons, then "no-match" (no tls service
// of the VIP and port answers the name and none is the default).
const (
	SNINoMatch     = numHelloReasons
	NumSNIRefusals = numHelloReasons + 1
	// numHelloReasons is len(tlshello.Reasons), checked by a test.
	numHelloReasons = 6
)

// SNIRefusalNames names the SNI refusal counters (Counters.SNIRefused), as
// the metrics label them.
var SNIRefusalNames = [NumSNIRefusals]string{"not-tls", "malformed", "oversized", "timeout", "eof", "error", "no-match"}

func sniReason(err error) int {
	r := tlshello.Reason(err)
	for i, n := range SNIRefusalNames[:numHelloReasons] {
		if n == r {
			return i
		}
	}
	return numHelloReasons - 1 // "error"
}

// routeTLS reads client's ClientHello and routes req to the tls service
// its server name names (Options.RouteSNI), setting req.Service and
// req.ServerName; it returns the client to splice (one that replays the
// ClientHello's bytes before the rest) and true, or resets the client,
// counts the refusal and returns false.
func (p *Proxy) routeTLS(req *ConnRequest, client Client) (Client, bool) {
	release := p.Hold(client) // Close ends the peek
	defer release()
	hs := req.Service.Timeouts.Handshake
	if hs <= 0 {
		hs = policy.DefaultHandshakeTimeout
	}
	_ = client.SetReadDeadline(time.Now().Add(hs))
	h, err := tlshello.Read(client, tlshello.MaxHello)
	_ = client.SetReadDeadline(time.Time{})
	if err != nil {
		if p.Closed() {
			p.count.Aborted.Add(1)
		} else {
			p.count.SNIRefused[sniReason(err)].Add(1)
		}
		client.Reset()
		return nil, false
	}
	req.ServerName = h.ServerName
	var vs *policy.VirtualServer
	if p.opts.RouteSNI != nil {
		vs = p.opts.RouteSNI(req.VIP, h.ServerName)
	} else if req.Service.AnswersSNI(h.ServerName) {
		vs = req.Service
	}
	if vs == nil {
		p.count.SNIRefused[SNINoMatch].Add(1)
		client.Reset()
		return nil, false
	}
	req.Service = vs
	p.count.SNIRouted.Add(1)
	return &helloClient{Client: client, hello: h.Raw}, true
}

// helloClient is a client leg whose first bytes read are the ClientHello
// routeTLS consumed; then it reads from the connection.
type helloClient struct {
	Client
	mu    sync.Mutex // the splice's reader and a Close in another goroutine
	hello []byte     // protected by mu: what is still to be replayed
}

// take moves up to len(b) replayed bytes into b.
func (c *helloClient) take(b []byte) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := copy(b, c.hello)
	c.hello = c.hello[n:]
	if len(c.hello) == 0 {
		c.hello = nil
	}
	return n
}

func (c *helloClient) pending() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.hello) > 0
}

// Read implements net.Conn: the replayed bytes first.
func (c *helloClient) Read(b []byte) (int, error) {
	if c.pending() {
		return c.take(b), nil
	}
	return c.Client.Read(b)
}

// ReadLent implements Leg: the replayed bytes first, in a buffer from pool.
func (c *helloClient) ReadLent(pool *sync.Pool, bp *[]byte) (*[]byte, int, error) {
	if c.pending() {
		if bp == nil {
			bp = pool.Get().(*[]byte)
		}
		return bp, c.take(*bp), nil
	}
	return c.Client.ReadLent(pool, bp)
}

// RouteSNIFunc is Options.RouteSNI's type: the tls service on vip for a
// ClientHello's server name ("" none), or nil.
type RouteSNIFunc func(vip netip.AddrPort, serverName string) *policy.VirtualServer
