package proxy

// The connection contract between the proxy that serves the connections
// weir/netstack accepts (Proxy) and the Admitter that decides about them (weir's
// cmd/weir/internal/admit): what a connection asks, what the Admitter
// answers, and what it hears of the connection until its End. Nothing here
// depends on gVisor: a leg is a net.Conn with half-close and counters.

//go:generate go run golang.org/x/tools/cmd/stringer@v0.52.0 -type=Verdict -linecomment -output=contract_string.go
import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"

	"weir/policy"
)

// ConnRequest describes a new connection asking to be admitted. The
// forwarder owns it; a Session may read it (it does not change after Admit
// except Attempt) until its End returns.
type ConnRequest struct {
	// ID identifies the connection in Conns and in its End's Stats; it is
	// unique for the forwarder's life.
	ID     uint64
	Client netip.AddrPort // the client's address and port
	VIP    netip.AddrPort // the virtual server address and port it asked for
	// Peer is the connection's own remote address and port when a
	// PROXY-protocol header was accepted from it (an outer load
	// balancer); Client is then the address the header carried. Zero
	// otherwise (see Conn).
	Peer    netip.AddrPort
	Service *policy.VirtualServer // the virtual server found for VIP; never nil
	// ServerName is a tls service's ClientHello server name (lower case,
	// "" when it sent none): Service is then the tls service it routed to
	// (tlsroute.go).
	ServerName string
	// Attempt is 0 in Admit and counts the failed dials in DialFailed.
	Attempt int
	// SettleFunc is Settle's work, set by the forwarder; nil: Settle
	// releases nothing.
	SettleFunc func() bool
}

// Conn is the connection's own remote address and port, as the datapath
// saw its packets: Peer when a PROXY-protocol header was accepted, else
// Client.
func (r *ConnRequest) Conn() netip.AddrPort {
	if r.Peer.IsValid() {
		return r.Peer
	}
	return r.Client
}

// Settle is for an Admitter about to refuse the connection at a limit: it
// releases the client's earlier connections that are finished as the client
// sees them but whose release weir has not processed yet (see release.go),
// waiting at most SettleWait, and reports whether any was released; if so,
// the Admitter should check its limits again. Call it only from Admit.
func (r *ConnRequest) Settle() bool {
	if r.SettleFunc == nil {
		return false
	}
	return r.SettleFunc()
}

// Verdict is an admission answer.
type Verdict uint8

const (
	// Accept connects the client to Decision.Target.
	Accept Verdict = iota // accept
	// RefuseRST resets the (established) client connection.
	RefuseRST // refuse-rst
	// Refuse503 answers with an HTTP 503 page naming Decision.Limit and
	// Decision.Value, then closes. For a tcp virtual server it acts as
	// RefuseRST.
	Refuse503 // refuse-503
)

// Decision is the Admitter's answer for one connection request.
type Decision struct {
	Verdict Verdict
	// Target is where an accepted connection goes; Accept needs it.
	Target *policy.Target
	// Action is the policy action the connection falls under (the datapath
	// flow's), for the per-target, per-action aggregation of Sample; nil:
	// none.
	Action *policy.Action
	// Dialer dials Target; nil means the forwarder's dialer for Target.Via.
	Dialer Dialer
	// Limit names the limit that tripped, as the Admitter spells it: weir's
	// appliance sends policy.LimitKind's configuration names,
	// "maxConnections" and "maxBandwidth", and "targets" when no target
	// could serve. Value is the limit's configured value (for "targets",
	// how many targets were named); Reason is a sentence for the 503 page.
	// The page shows all three as given.
	Limit  string
	Value  int64
	Reason string
	// Limits, when set, is every limit that was over, the first one first
	// (Sun's page states "which limits caused the 503"): the page lists
	// them all, each with its level and measured statistic.
	Limits []PageLimit
	// RetryAfter is the 503's Retry-After; zero means DefaultRetryAfter.
	RetryAfter time.Duration
}

// Admitter decides about new connections. Admit is called from many
// goroutines at once, once per connection to a virtual server, when the
// client's handshake has completed (a half-open handshake never reaches
// it).
type Admitter interface {
	// Admit returns the first decision and the connection's Session. The
	// Session may be nil only with a refusal, when the Admitter wants to
	// hear nothing more of the connection; an Accept without a Session is
	// refused with RST. Admit must not keep req past the Session's End.
	Admit(req *ConnRequest) (Decision, Session)
}

// Session follows one connection after Admit: it is where the Admitter keeps
// what it reserved for the connection (an admission ticket, a target slot)
// and learns what became of them. Every method is part of the contract: a
// Session that has nothing to do in one writes it as an empty method. The
// forwarder calls DialFailed and TargetFailed only from the connection's own
// goroutine, one call at a time, then End exactly once; Released (below) may
// come from another of the connection's goroutines, never at the same time
// as another call. After End returns the forwarder holds no reference to the
// Session, and the Session must release what it holds.
type Session interface {
	// DialFailed reports that dialing failed.Target failed with err and
	// asks what to do next: another Accept to try another target, or a
	// refusal. The proxy dials every Accept it is given: bounding the
	// attempts is the Session's (weir's balancer tried-set does it). A dial
	// cut short by Close (Proxy's, or the Forwarder's) is not reported
	// here; the connection ends with Aborted.
	DialFailed(failed Decision, err error) Decision
	// TargetFailed reports a target that failed after its dial succeeded:
	// it stayed silent past the first-byte timeout (err is then
	// ErrFirstByteTimeout). It comes before Released and End, from the
	// connection's goroutine (a spliced connection released first by the
	// idle watchdog or Close hears it after Released). weir's appliance
	// marks the target down for the retry interval, as for a failed
	// dial, with the lease Released gives back. Only the target's own
	// failures come here: a client that sends a bad body, cuts it short or
	// sends it slowly fails its request, never the target.
	TargetFailed(d Decision, err error)
	// Released reports that the connection is finished as the client sees
	// it, before End: the client has sent its FIN and weir its own (or the
	// connection was reset or aborted). What remains then is weir's
	// teardown (the target's side, final counters), which a client that
	// reconnects at once must not have to wait for: weir's appliance gives
	// the admission ticket and the target slot back here, so a sequential
	// client at maxConnections 1 is never refused. The forwarder calls it at
	// most once per spliced connection, always before End; it may come from
	// any of the connection's goroutines (a copy half, the idle watchdog,
	// Close) and must not block. An http request's Session hears it once
	// the whole response is buffered for the client, before its last bytes
	// are sent. A connection never spliced (refused, or every dial failed)
	// goes straight to End.
	Released()
	// Spliced reports the bytes the splice of a tcp connection writes,
	// either direction, as it writes them (weir's per-client bandwidth
	// counts them). It may be called from both copy halves at once and
	// must not block.
	Spliced(n int64)
	// End reports how the connection ended. e is valid only during the
	// call. It must not block.
	End(e *End)
}

// ErrFirstByteTimeout is the error a TargetFailed and the End of a
// TargetTimedOut connection carry.
var ErrFirstByteTimeout = errors.New("netstack: target sent nothing within the first-byte timeout")

// Outcome is how a connection ended.
type Outcome uint8

// The outcomes End reports. Their String forms are the access log's.
const (
	// Served: spliced to its target, then closed by the client or target.
	Served Outcome = iota
	// IdleClosed: spliced, then closed by IdleTimeout.
	IdleClosed
	// RefusedReset: refused with RST (a RefuseRST, or a Refuse503 for a
	// tcp virtual server).
	RefusedReset
	// RefusedPage: answered with the 503 page.
	RefusedPage
	// Aborted: Close (Proxy's, or the Forwarder's) ended the connection.
	Aborted
	// TargetTimedOut: spliced, then the target sent nothing within the
	// first-byte timeout; the client got the 503 page (http) or RST.
	TargetTimedOut
	// Panicked: a panic in the connection's goroutines ended it.
	Panicked
	// BadGateway (an http request): the target reset or closed its
	// connection, or stalled, before its response was complete. Before
	// the response head the client got a 502; after it, a response cut
	// with a RST (a close-delimited body ended by a FIN would look
	// complete). RequestEnd.Status is what the client was sent.
	BadGateway
	// ClientFailed (an http request): the client's request body was
	// malformed, cut short, or stalled past the idle timeout; the client
	// got a 400 (408 for the stall) and its connection closed. The target
	// is not blamed for it.
	ClientFailed
	numOutcomes
)

var outcomeNames = [numOutcomes]string{"ok", "idle", "reset", "503", "aborted", "target-timeout", "panic", "bad-gateway", "client-error"}

// String returns the outcome as the access log writes it: "ok", "idle",
// "reset", "503", "aborted", "target-timeout", "panic", "bad-gateway",
// "client-error".
func (o Outcome) String() string {
	if o < numOutcomes {
		return outcomeNames[o]
	}
	return "outcome(?)"
}

// End is how one connection ended, for Session.End.
type End struct {
	Outcome Outcome
	// Decision is the last decision made: the Accept whose target was
	// dialed (Served, IdleClosed, handshake failures after a dial), or the
	// refusal with its Limit, Value and Reason.
	Decision Decision
	// Refusal says what a refused client was sent (RefusedReset,
	// RefusedPage).
	Refusal Refusal
	// Stats are the connection's final statistics. For a connection never
	// spliced only ID, Client, VIP, Service, Target and Start are set.
	Stats ConnStats
	// Dials is the number of failed dials before the end.
	Dials int
	// Err is the handshake's error for the handshake outcomes, the dial's
	// for an Aborted dial; nil otherwise.
	Err error
	// Request is set when the End is one http request's (a RequestAdmitter's
	// Session): Stats then has the connection's ID, client, VIP, service
	// and target, and the request's bytes (TargetLeg.BytesSent the
	// request's, ClientLeg.BytesSent the response's); no leg counters.
	Request *RequestEnd
}

// Refusal is what a refused client was sent.
type Refusal struct {
	// Status is 503 when a page was served, 0 for a RST.
	Status int
	// RequestLine is the HTTP request line read before the 503 page ("" if
	// none arrived in time); Bytes is the size of the response sent.
	RequestLine string
	Bytes       int
}

// RequestAdmitter admits the requests of http virtual servers one by one
// (netstack/proxy/http's Options.RequestAdmitter). For such a service the
// proxy calls AdmitClient once per client connection and AdmitRequest
// once per request head; the connection Admitter's Admit is not called.
// Both are called from the connection's goroutine.
type RequestAdmitter interface {
	// AdmitClient admits a client connection: an Accept (Target unused)
	// lets it send requests, and release is called exactly once when the
	// connection is over (before weir's FIN). A refusal is answered as in
	// Admit (the 503 page, or RST) and release may be nil.
	AdmitClient(req *ConnRequest) (d Decision, release func())
	// AdmitRequest decides about one request whose head was parsed, and
	// returns its Session, as Admit does for a connection: the request is
	// counted until that Session's End, which comes when its response has
	// been written completely (End.Request is set).
	AdmitRequest(req *ConnRequest, r *Request) (Decision, RequestSession)
	// BadRequest hears of a request refused before admission (400, 408,
	// 431): e is valid only during the call.
	BadRequest(req *ConnRequest, e *RequestEnd)
}

// RequestSession is the Session of one http request (AdmitRequest's). Besides
// a Session's calls it hears the request's bytes on the client connection as
// they move, for the bandwidth limits: the datapath meters a client
// connection as a whole and cannot tell one request from the next.
type RequestSession interface {
	Session
	// Moved reports bytes of the request that went over the client
	// connection since the previous call: payload is the bytes weir read
	// from or wrote to the client for it (its head, its body as sent,
	// chunk framing included, its response with the 1xx heads relayed);
	// wire adds to them the TCP/IP headers of the client connection's
	// segments (pure ACKs too) sent and received since the previous call,
	// counted from the connection's segment counters at IPv4 20 B or IPv6
	// 40 B plus 32 B of TCP header (timestamps on).
	//
	// Only a request that reached a target is reported: a refused
	// request's head and body, and every page weir writes itself (the 503
	// of a refusal or a first-byte timeout, the 502), never are. The head
	// is reported once a target connection is ready, then the body as it
	// is read, the response as it is written to the client's buffer, 16
	// KiB at a time (all of it before Released; request body bytes still
	// arriving after Released are not reported). It may be called from the connection's
	// goroutine and from its request body writer at once, and must not
	// block.
	Moved(payload, wire int64)
}

// Request is one parsed request head, for AdmitRequest.
type Request struct {
	Seq    int    // 1 for the connection's first request
	Method string // as sent
	Line   string // the request line, printable ASCII (see RequestLine)
	Host   string
	// Header is the head as parsed, hop-by-hop fields included. Read only.
	Header http.Header
	Start  time.Time // when the head was parsed
}

// RequestEnd is how one request ended: in End.Request, or BadRequest's.
type RequestEnd struct {
	Seq  int
	Line string // request line; "" when none was read
	// Status is the status sent to the client (0: none could be sent).
	Status int
	// RequestBytes and ResponseBytes are the bytes of the request sent to
	// the target and of the response written to the client, heads
	// included.
	RequestBytes, ResponseBytes int64
	Start                       time.Time // head parsed (or first byte, for BadRequest)
	Duration                    time.Duration
	// Reused says the request went over a pooled target connection;
	// Retried that a pooled one failed and a fresh one carried it.
	Reused, Retried bool
}

// Dialer opens the target leg of a connection. One is chosen per target by
// policy.Target.Via: weir/netstack's HostDialer for DialHost, StackDialer
// for DialNetstack.
type Dialer interface {
	// DialTarget connects to addr, giving up when ctx is done.
	DialTarget(ctx context.Context, addr netip.AddrPort) (Leg, error)
}

// Leg is one side of a proxied connection (the client leg or the target
// leg): a stream with half-close whose TCP counters can be read.
type Leg interface {
	net.Conn
	// CloseWrite shuts the sending direction down (sends FIN).
	CloseWrite() error
	// Counters returns the leg's TCP counters since it opened. It is safe
	// to call at any time, also after Close (it then returns the last
	// values it could read).
	Counters() LegCounters
	// ReadLent reads like Read into a buffer from pool that the caller
	// holds only while data waits: bp is the buffer it holds now (nil:
	// none). While the leg has nothing to read, ReadLent gives bp back to
	// pool and waits with no buffer held; it takes one for the read. It
	// returns the buffer the caller holds afterwards, not nil when n > 0.
	// An idle splice so pins no buffer (weir/netstack's Conn and HostConn
	// wait without one); a leg that cannot wait without reading uses
	// ReadHeld. Only the splice's one reader calls it.
	ReadLent(pool *sync.Pool, bp *[]byte) (_ *[]byte, n int, err error)
}

// ReadHeld is ReadLent for a leg that cannot wait for data without reading:
// it takes a buffer from pool if the caller holds none and keeps it
// throughout.
func ReadHeld(r io.Reader, pool *sync.Pool, bp *[]byte) (*[]byte, int, error) {
	if bp == nil {
		bp = pool.Get().(*[]byte)
	}
	n, err := r.Read(*bp)
	return bp, n, err
}

// LegCounters are one TCP connection's counters as the stack that
// terminates it sees them. All counts are totals since the connection opened.
type LegCounters struct {
	SegmentsSent     uint64
	SegmentsReceived uint64
	Retransmits      uint64 // segments retransmitted, for any reason
	FastRetransmits  uint64 // segments retransmitted in fast recovery
	Timeouts         uint64 // retransmission timeouts (RTO expiries)
	// TimeoutsKnown is false where the source does not count RTO expiries
	// (a host socket on a kernel older than 6.7); Timeouts is then 0.
	TimeoutsKnown bool
	RTT           time.Duration // smoothed round-trip time
	RTTVar        time.Duration // round-trip time variation
	// DataSegmentsIn and DataSegmentsOut count the segments with payload
	// received and sent, OutOfOrderIn those received beyond the next
	// expected byte: TCP_INFO's data_segs_in, data_segs_out and
	// rcv_ooopack on a host socket; 0 on a gVisor leg, whose data segments
	// the datapath counts (see direction.go).
	DataSegmentsIn, DataSegmentsOut, OutOfOrderIn uint64
	// Unacked is, on a host socket, the bytes the peer has not
	// acknowledged yet (TCP_INFO: notsent_bytes plus its unacked segments
	// times the MSS); 0 on a gVisor leg, whose endpoint does not say (the
	// datapath does: LegMeter.Unacked).
	Unacked uint64
}

// LegStats are one leg's counters plus the bytes weir moved on it.
type LegStats struct {
	LegCounters
	BytesSent     uint64 // bytes weir wrote to this leg
	BytesReceived uint64 // bytes weir read from this leg
}

// ConnStats is one connection's record: both legs, measured.
type ConnStats struct {
	ID      uint64
	Client  netip.AddrPort
	VIP     netip.AddrPort
	Service string // virtual server name
	Target  string // target name ("" when no target leg was opened)
	Action  string // policy action name, "" for none
	Start   time.Time
	// ClientLeg is weir ⇄ client, TargetLeg weir ⇄ target.
	ClientLeg LegStats
	TargetLeg LegStats
	// Throughput is bytes per second, both directions, since the last
	// Sample (or since Start).
	Throughput float64
}
