// Package config reads weir's configuration files into a compiled
// *policy.Config: the YAML format (the main one) and the z/OS Policy Agent
// statement syntax (PolicyPerfMonitorForSDR, PolicyAction, PolicyRule), which
// is read verbatim and may also be included from a YAML file.
//
//	cfg, err := config.Load("weir.yaml") // or a .pa file
//	if err != nil {
//		fmt.Fprintln(os.Stderr, err) // every error, one "file:line:col: reason" per line
//	}
//
// Every problem in a file is reported, not only the first: parse functions
// return an ErrorList whose entries each carry the file, line and column.
// The result has been through policy.Compile, so defaults are filled in.
//
// config owns file formats and their validation, nothing else. It may import
// the standard library, the YAML library (go.yaml.in/yaml/v3) and policy;
// never a logger (zerolog), gVisor, datapath, netstack, balancer or cmd. It
// does not watch files or log; the control plane calls Load and swaps the
// result.
//
// # Choosing the format
//
// Load and Parser.Parse use the extension: .yaml and .yml are YAML; .pa,
// .policy and .conf are Policy Agent statements. Any other name is sniffed:
// a file whose first word (comments skipped) is PolicyAction, PolicyRule or
// PolicyPerfMonitorForSDR, in any case, is Policy Agent; anything else is
// YAML. A Policy Agent file alone is a complete config: it defines the
// monitor, rules and actions, and no services.
//
// # YAML schema
//
// Keys are case-sensitive and camelCase; an unknown key, a key given twice, a
// value of the wrong type or out of range is an error. Durations are Go
// durations ("30s", "100ms", "1m"). Byte counts and bandwidths (bytes per
// second) are plain integers or carry a suffix: B, kB or KB (1000), MB, GB,
// KiB (1024), MiB, GiB. Anchors and aliases are allowed. Every top-level key
// is optional; an empty file is a valid config with defaults.
//
//	instance:                  # the whole appliance: the top of the limit hierarchy
//	  name: edge               # default "weir"
//	  metricInterval: 30s      # bandwidth averaging window, default 30s, > 0
//	  recomputeInterval: 100ms # default 100ms; must divide metricInterval
//	  bandwidthBytes: payload  # what bandwidth limits count: payload (TCP payload, default) or wire (whole packets), of admitted connections only
//	  limits: LIMITS
//	  clientLimits: CLIENTLIMITS # each client's own limits across every service
//	  timeouts: TIMEOUTS       # every service's defaults
//	classes:                   # Sun's virtual-server classes, in file order
//	  - name: gold             # required, unique
//	    parent: premium        # optional: another class; chains must not loop
//	    limits: LIMITS
//	services:                  # virtual servers
//	  - name: web              # required, unique
//	    class: gold            # optional: a class name
//	    vips: [198.18.0.10, "fd00::10"] # required: IPv4 and/or IPv6
//	    port: 80               # required: 1..65535, or a range "8000-8010"
//	    protocol: http         # tcp (default: refuse with RST), http (refuse with a 503 page), tls (TLS passthrough routed by server name, refused with RST) or udp (datagram sessions; a refused session's datagram is dropped and counted)
//	    sni: [www.example.com, "*.example.com", default] # protocol tls only, required there: the ClientHello server names it answers for; "*." one label; default: no other tls service of its VIP and port matches, or no server name
//	    limits: LIMITS
//	    clientLimits: CLIENTLIMITS # each client's own limits at this service (http: requests in flight)
//	    timeouts: TIMEOUTS     # overrides the instance's, field by field
//	    http: HTTP             # protocol http only: request handling
//	    udp: UDP               # protocol udp only: sessions
//	    hashBy: client         # overrides balancer.hashBy; header and cookie need protocol http (a tcp service given them by the balancer hashes by client)
//	    healthCheck: HEALTH    # overrides balancer.healthCheck: omitted interval, timeout, rise, fall take the balancer's; the probe (http, send/expect, udp) is this one's (none: a TCP connect); a udp service's must have the udp probe, and without one it has no active check
//	    acceptProxyProtocol: v2 # v1, v2 or any: read an outer load balancer's PROXY-protocol header first (within timeouts.handshake); its client address is the client's for rules, limits, hashBy, the access log and X-Forwarded-For; no, a malformed or an untrusted header: RST (tcp) or 400 (http)
//	    trustedProxies: [198.18.9.0/24] # required with acceptProxyProtocol: the prefixes (or addresses) a header is accepted from
//	    targets:               # required, at least one
//	      - name: member05     # default: the address; unique within the service
//	        address: 198.18.1.5:9080 # required: IP:port ([fd00::5]:9080), no host names; an IP alone (or port 0) keeps the client's port
//	        weight: 10         # WLM weight 0..1000, default 1; 0: draining, no new connections
//	        maxConnections: 3  # -1 or 0: no limit (the default)
//	        role: primary      # primary (default) or backup; backups are tried in order
//	        via: host          # host (default: kernel socket) or netstack (weir's back NIC)
//	        proxyProtocol: v2  # v1 or v2: a PROXY-protocol header (client and VIP address and port) before any byte of each connection; health checks send v2 LOCAL (v1 UNKNOWN); http services then pool target connections per client
//	actions:                   # Policy Agent actions: the service level a flow gets
//	  - name: telnetGold       # required, unique
//	    outgoingTOS: "10100000" # ToS byte: 8 binary digits, 0xA0, 0b101 or 0d160; no bare decimal
//	    minRate: 500           # Kbit/s per connection, 0: none
//	    meanRate: 2000         # Kbit/s, the DiffServ mean rate, 0: none
//	    maxConnections: 100    # the base of maxConnWeightFr; -1 or 0: none
//	rules:                     # Policy Agent rules, in priority order: the FIRST match wins
//	  - name: telnet           # required, unique
//	    protocol: 6            # IP protocol number or range "6-17" (0..255); omitted: any
//	    sourcePorts: 23        # the server side (VIP) port or range; omitted: any
//	    destinationPorts: "1024-65535" # the client side port or range; omitted: any
//	    sourcePrefix: 198.18.0.0/15    # the server side address: prefix or address
//	    destinationPrefix: "fd00::/8"  # the client side address
//	    service: web           # optional: only flows of this service
//	    action: telnetGold     # required: an action defined here or in an include
//	monitor:                   # PolicyPerfMonitorForSDR
//	  enabled: true            # default true when the section is present
//	  samplingInterval: 60s    # default 60s, > 0
//	  lossRatioAndWeightFr: [20, 25]    # loss above 2.0 % (tenths of %, 1..1000) cuts 25 % per step (1..100)
//	  timeoutRatioAndWeightFr: [50, 50] # likewise for RTO timeouts
//	  lossMaxWeightFr: 95      # cap of the loss fraction, percent 1..100
//	  timeoutMaxWeightFr: 100  # cap of the timeout fraction, percent 1..100
//	  maxConnWeightFr: [50, 65, 80]     # percent of an action's maxConnections, ascending 1..100
//	  direction: fromTarget    # the segments the ratios read: fromTarget (default: the target's), toTarget (weir's) or both (the larger)
//	  scope: policy            # the connections monitored: policy (default: those a rule matched) or all
//	  hostCapture: on          # on (default): via: host legs measured from their captured segments (AF_PACKET, needs CAP_NET_RAW at start); off: from_target is TCP_INFO's estimate
//	  minSegments: 100         # noise guard: ratios judged over at least this many segments, accumulated over quiet intervals; 1..2^30
//	  errorRatioAndWeightFr: [50, 25]   # http targets: 5xx responses above 5.0 % of an interval's responses (tenths of %, 1..1000) cut 25 % per step (1..100); added to loss and timeout, capped at 100; omitted (default): no error fraction
//	  errorMaxWeightFr: 100    # cap of the error fraction, percent 1..100, default 100
//	  errorMinResponses: 20    # the error part's noise guard: judged over at least this many responses, accumulated over quiet intervals; default 20
//	  errorCountsFailures: false # true: requests that failed before a response (first-byte timeout, connection cut) count as errors too
//	balancer:
//	  algorithm: round-robin   # round-robin (default), least-conn or maglev
//	  retryInterval: 60s       # how long a failed target stays down, default 60s, > 0
//	  maxAttempts: 3           # targets tried per connection, 1..16, default 3
//	  refreshInterval: 0s      # config file check period; 0 (default): off, SIGHUP still reloads
//	  slowStart: 0s            # weight ramp of a recovered target; 0: off
//	  healthCheck: HEALTH      # active checks of every tcp, http and tls service's targets (not udp: the probes speak TCP; no udp probe here); a service's own overrides it
//	  hashBy: connection       # maglev's key: connection (default: the 5-tuple), client (the client's address), header:X-User or cookie:session (http, per request; absent: the client's address); other than connection needs algorithm maglev
//	  ejection:                # outlier ejection; omitted (default): off
//	    consecutiveFailures: 5 # required, 1..100: failures in a row (failed connects, first-byte timeouts, with serverErrors 5xx responses) that eject a target; a success resets the run
//	    for: 30s               # how long an ejected target stays out, default 30s, > 0
//	    maxPercent: 50         # never more than this share of a service's targets ejected at once, 1..100, default 50
//	    serverErrors: false    # true: an http response with a 5xx status counts as a failure
//	cluster:                   # optional: instances sharing their limits and measurements through Redis
//	  redis: 127.0.0.1:6379    # required: host:port or redis://[user:pass@]host:port/db (rediss:// for TLS)
//	  name: edge               # required: instances with the same name share state
//	  instance: weir-a         # this instance's id among the members; default the host name
//	  leaseInterval: 1s        # lease and membership renewal, 10ms..1m, default 1s; a dead instance's slots free after 3 intervals
//	  onRedisDown: localShare  # Redis unreachable: localShare (default: limit ÷ live members each), failOpen (full limit each) or failClosed (refuse)
//	  borrowTimeout: 20ms      # a connection or request refused by this instance's full share of a cluster-wide limit asks Redis for more slots, waiting at most this long, default 20ms, at most leaseInterval/2; it also bounds the round trip that checks a per-client maxConnections cluster-wide
//	include: [zos-telnet.pa]   # Policy Agent files (a list or one name), relative to this file
//	noServices: true           # say that no service is defined on purpose; default false
//
// HEALTH is an active health check: each target dialed on a fresh
// connection the way its traffic goes (its via), every interval; fall
// failures in a row mark it down (no new connections; a udp service: no
// new sessions), rise passes in a row bring it back. With no probe a
// completed TCP handshake passes; http or send/expect test the service;
// udp is the probe of a udp service, and its only one:
//
//	interval: 5s               # 0 (default): off
//	timeout: 2s                # default interval/2; must be shorter than interval; bounds the whole check
//	rise: 2                    # successes to mark up, 1..100, default 2
//	fall: 3                    # failures to mark down, 1..100, default 3
//	http:                      # an HTTP/1.1 request, Connection: close; the response status judged
//	  method: GET              # default GET
//	  path: /healthz           # default /; starts with /
//	  host: www.example.com    # the Host header, default the target's address
//	  expectStatus: 200-399    # passing statuses: a code or a range lo-hi within 100..599, default 200-399
//	send: "PING\r\n"           # tcp: bytes written once connected (not with http)
//	expect: "+PONG"            # tcp: the first bytes read must be these; or a mapping:
//	expect: {regexp: "^SSH-2\\.0-"} # the first bytes read (up to 4096) must match this Go regular expression
//	udp:                       # protocol udp only, and required there: one datagram, the replies within timeout judged
//	  send: {dns: www.example.com, type: A} # a DNS query (RD, class IN) with a fresh random ID per probe; type A (default), AAAA, NS, CNAME, SOA, PTR, MX, TXT, SRV, ANY or 1..65535
//	  expect: {rcode: NOERROR} # with send dns: the reply with the query's ID and QR set must carry this RCODE: NOERROR (default), FORMERR, SERVFAIL, NXDOMAIN, NOTIMP, REFUSED, 0..15 or any
//	  send: "PING\n"           # or: the datagram as text (its UTF-8 bytes), 1..65507 bytes
//	  send: {hex: "00 01 ff"}  # or: the datagram as hex digits, two per byte; spaces, ':' or '-' may separate bytes
//	  expect: "PONG"           # without dns: a reply passes when it begins with these bytes; also {hex: "504f"}, or {regexp: "^PONG \\d"} (matched within the whole datagram); omitted: any reply passes
//
// A failed check's reason is shown in /status and weir status: refused,
// timeout, unreachable, reset, status 503, expect mismatch or closed (the
// target closed before answering).
//
// The udp probe sends its datagram from a fresh connected UDP socket, the
// socket a session's datagrams take: a host socket, or through the back
// arm for a `via: netstack` target (no back arm: the check fails as the
// sessions' dials do). It reads replies until timeout: the first that
// passes passes the check; ICMP port unreachable (the target's port
// closed) fails it at once, "refused"; a reply that does not pass (another
// DNS ID: a stale or spoofed answer; the query echoed back; bytes not
// matching expect) is ignored, and if none passes the reason counts them,
// "expect mismatch: 2 replies ignored, last: DNS ID 0x1a2b, want 0x3c4d";
// no reply at all is "timeout". The DNS answer to the query with another
// RCODE fails at once ("DNS rcode SERVFAIL, want NOERROR"). A target that
// stops answering without closing its port (hung, or dropped on the way)
// gives no ICMP: the checks of a service run in parallel and the next
// round starts interval after the slowest ended, so it is marked down
// after about fall × (interval + timeout); a closed port after about
// fall × interval. A udp service without a healthCheck of its own has no
// active check: its targets' health is passive, the share of
// request/response sessions left unanswered (udp.responseTimeout) cutting
// their weight through monitor.timeoutRatioAndWeightFr.
//
// LIMITS is the same mapping at each of the three levels; a zero or omitted
// field is no limit at that level, and admission checks the service, then its
// class chain, then the instance. A service's own maxConnections (with its
// enforceConnections) overrides its classes' and the instance's for its
// connections, and its own maxBandwidth (with enforceBandwidth and
// burstBytes) theirs for bandwidth, as Sun's "override these server or
// class-level settings for an individual virtual server"; the class and the
// instance still count its connections and bytes in their sums, which their
// limits hold the other services to:
//
//	maxBandwidth: 1MB          # bytes per second over metricInterval
//	enforceBandwidth: true     # refuse new connections on reaching it; false: log when exceeded
//	maxConnections: 100        # concurrent connections; -1 or 0: no limit
//	enforceConnections: true   # refuse at the limit; false: log only
//	burstBytes: 64KiB          # optional token bucket refilled at maxBandwidth; needs maxBandwidth
//	queue: 8                   # up to 8 connections (http: requests) over an enforced maxConnections wait, first in first out; 0 (default): refused at once
//	queueTimeout: 2s           # a wait's bound, then RST or the 503 page naming the limit; default 2s
//
// A queue hands a freed slot to its first waiter before any new arrival: a
// level whose queue is not empty sends every arrival to its tail, and one
// that finds it full is refused at once ("queue full" in the refusal). The
// wait is inside the connection (its handshake is complete) and counts in
// the access log (queue_wait_ms; CLF: queue=µs), /status, weir status and
// the weir_queue_* metrics. In cluster mode a connection at its instance's
// full share borrows first and queues when the cluster cannot lend, asking
// again every 100 ms while it waits.
//
// CLIENTLIMITS are limits each client gets on its own, checked before the
// levels (the service's clientLimits, then the instance's): the refusal
// and the log line name the client, "client 198.18.5.1: maxConnections 2
// reached (2 open)". They take the LIMITS keys but burstBytes, and:
//
//	maxConnections: 2          # per client; http: requests in flight
//	maxBandwidth: 100kB        # per client, bytes per second over metricInterval
//	clientPrefix: {ipv4: 24, ipv6: 64} # group clients by prefix; default 32 and 128 (each address alone)
//	tableSize: 100000          # clients kept, 1..16777216, default 100000
//
// The table keeps one entry per client (about 120 bytes; 360 with
// maxBandwidth, whose window is 30 slots of metricInterval/30). At
// tableSize a new client replaces the least recently used idle one (no
// connection open, none queued); when every entry is active the new
// client is admitted without a client limit and counted as overflow
// (weir_client_table_overflow_total). A client's address is the carried
// one when a PROXY header gave it. Each instance keeps its own table; in
// cluster mode an enforced maxConnections is also cluster-wide: a connection
// (http: a request) this instance's table admits is asked of Redis at once
// (one round trip, bounded by cluster.borrowTimeout), and the refusal then
// reads "client 198.18.5.1: maxConnections 2 reached (2 open cluster-wide,
// 0 here)". A client's maxBandwidth and a logged maxConnections stay per
// instance (docs/cluster.md, "Per-client limits").
//
// TIMEOUTS bound each phase of a connection; under instance they are every
// service's defaults, under a service they override the instance's field by
// field. weir check prints the values in force:
//
//	handshake: 5s              # a client handshake not completed in time is aborted (on a listener too: the VIP leaves SYN-cookie mode that long after a flood); protocol tls: the ClientHello must be read within it too, else RST
//	connect: 3s                # one dial to a target; a timeout marks the target down (retryInterval)
//	firstByte: 30s             # target's first byte after the whole request (tcp: the client's first); "off" or a duration; a timeout marks it down (http: a request the target never acknowledged whole is a 502 instead, the target stays up)
//	idle: 5m                   # no byte either way closes the connection; "off" or a duration
//	requestRead: 2s            # reading a refused HTTP request's head before the 503 page
//	inFlightPerVIP: 1024       # a VIP and port's backlog, 1..65535: half-open handshakes (beyond: SYN cookies) and connections not yet accepted
//
// HTTP tunes an http service, which weir proxies request by request: each
// request head is parsed, admitted (limits count requests in flight) and
// routed on its own, and target connections are pooled:
//
//	headerTimeout: 10s         # one request head, from its first byte; exceeded: 408
//	maxHeaderBytes: 32KiB      # one request head; exceeded: 431
//	keepAliveIdle: 60s         # a client connection with no request in flight
//	maxClients: 10000          # open client connections of the service (apart from the request limits); over: 503
//	backendIdle: 30s           # a pooled target connection unused
//	maxIdlePerTarget: 32       # pooled target connections per target
//	forwarded: x-forwarded-for # or forwarded (RFC 7239), both, none
//
// UDP tunes a udp service. A session is one client address and port with
// the VIP and port it sent to; its first datagram admits it (the limits
// count it as one connection, the balancer picks its target, maxConnections
// counts sessions, bandwidth counts datagram payload), then every datagram
// is relayed on its own both ways, in order, never merged, replies leaving
// from the VIP. Its active health check is its own healthCheck with the udp
// probe (HEALTH; a DNS query and the reply with its ID for DNS): the
// balancer's speaks TCP and does not apply to it:
//
//	idleTimeout: 30s           # no datagram either way ends the session, default 30s
//	responses: 1               # the session ends after this many datagrams from the target (DNS: 1); 0 (default): only idleTimeout
//	responseTimeout: 2s        # with responses: a session with no reply by then ends, unanswered; a target's unanswered share is its timeout ratio (monitor.timeoutRatioAndWeightFr)
//	maxSessions: 10000         # open sessions per VIP and port, 1..16777216, default 10000; a new session's datagram past it is dropped and counted
//
// noServices exists for reloads: weir run refuses a reload that would remove
// every service (a file caught empty or half-written, an editor's truncate)
// unless the new file says `noServices: true`. The key is an error in a file
// that defines services. An empty file still parses (weir check accepts it,
// weir run starts on it); only the reload that would empty a running
// appliance asks for the key. A Policy Agent file cannot carry it: include
// the Policy Agent file from a YAML file that does.
//
// Whole-file checks: a VIP and port may belong to one service only (port
// ranges overlapping on a shared VIP are an error); names are unique per
// kind; every class, service and action a reference names must exist.
//
// Rules from included files follow the YAML file's own rules, in include
// order; they share one namespace of actions and rules with the YAML file,
// so a YAML rule may name an action an included file defines. The monitor
// may be defined once, in the YAML file or in an include.
//
// # Policy Agent statements
//
// The syntax of z/OS Communications Server's Policy Agent: a statement, its
// arguments, and a block of one attribute per line; `#` starts a comment;
// keywords are case-insensitive, names are not; blocks may open on the next
// line and may nest. weir reads these statements and attributes:
//
//	PolicyPerfMonitorForSDR enable|disable   # no argument: enable
//	{
//	  SamplingInterval 60                    # seconds, 1..86400
//	  LossRatioAndWeightFr 20 25             # tenths of % (1..1000), % (1..100)
//	  TimeoutRatioAndWeightFr 50 50
//	  LossMaxWeightFr 95                     # % 1..100
//	  TimeoutMaxWeightFr 100
//	  MaxConnWeightFr 50 65 80               # ascending % 1..100
//	}
//	PolicyAction telnetGold
//	{
//	  OutgoingTOS 10100000                   # 8 binary digits: 0xA0; or 0xA0, 0b101, 0d160
//	  MinRate 500                            # Kbit/s
//	  MeanRate 2000                          # Kbit/s
//	  MaxConnections 100
//	}
//	PolicyRule telnet
//	{
//	  ProtocolNumberRange 6                  # or 6 17
//	  SourcePortRange 23                     # or 8000 8010 (server side)
//	  DestinationPortRange 1024 65535        # client side
//	  SourceAddressRange 198.18.0.0/15       # a prefix, an address, or "low high" forming a prefix
//	  DestinationAddressRange fd00::/8
//	  PolicyActionReference telnetGold
//	}
//
// A ToS byte (OutgoingTOS in either syntax) is spelled one of four ways that
// cannot be misread: exactly 8 binary digits as the Policy Agent writes it,
// 0x and hex, 0b and binary, or 0d and decimal. A bare number that is not 8
// binary digits (101, 0100, 160) is an error naming these forms: read as
// binary, decimal or octal it would be three different bytes.
//
// Rules apply in file order and the first match wins. Other Policy Agent
// attributes weir knows of but does not implement (MaxRate, PolicyScope,
// Priority, …) are errors that say so; anything else is an unknown keyword.
package config
