// Package cluster shares the limits and measurements of several weir
// instances through one Redis, so that the instances behind one ECMP router
// enforce one set of limits and judge each target alike:
//
//   - connection limits, exactly (this file): the sum of their open
//     connections never exceeds an enforced maxConnections of the
//     instance, a class, a virtual server or a target (WebSphere's
//     MaxConnections, leased the same way and enforced by the balancer's
//     share, balancer.Balancer.SetCapacity);
//   - bandwidth, one recompute interval behind, and the counts of logged
//     connection limits (bandwidth.go);
//   - the targets' samples and down-states, one sampling interval behind,
//     so that every instance gives a target the same weight (samples.go).
//
// Each is one Lua script call per interval; none is on the admission path
// except Borrow, which a caller may make for a refused connection.
//
//	c, err := cluster.New(cluster.Options{Config: *cfg.Cluster, Admission: adm, Logf: log.Printf})
//	go c.Loop(ctx)   // until ctx ends
//	defer c.Close()  // gives the slots back
//
// # Leases of slots
//
// Each instance holds, per enforced level, a lease of N slots recorded in
// Redis, and policy.Admission admits at most N connections at that level
// locally (Admission.SetCapacity): admission never waits on Redis. Loop
// renews every lease once per lease interval with one Lua script (one round
// trip for the membership and every level), which atomically
//
//   - drops the leases of members whose record expired (a dead instance's
//     slots are free again after policy.LeaseTTLFactor intervals; under
//     failClosed one lifetime later, see hold),
//   - works out every live member's part of the limit from the demands
//     recorded (alloc.lua: demand, spare and an even part of the rest while
//     they fit, so that an idle member holds limit ÷ members; in proportion
//     to demand under contention),
//   - grants this member its part out of what the others' leases leave
//     (it keeps a larger share unless another member is below its part),
//   - records max(grant, floor), where floor bounds the connections the
//     instance may still have open: a lease is never recorded below what is
//     in use, so the recorded leases, and with them the open connections,
//     never add up to more than the limit.
//
// A member's demand is its open connections plus those its share refused
// since its last renewal. A share the answer lowers is lowered first and
// its smaller lease recorded right after (release.lua), so that slots go
// back at that renewal. The members nudge each other through Pub/Sub: one
// that joins or leaves publishes to all; one below its part while others
// hold slots above their own, a borrow, and one that gave slots back
// publish to the own channel of only as many members as cover what is
// lacking or freed, the largest first; those renew at once (rate-limited
// while their renewals move nothing). Between renewals Loop also checks the local demand every tenth
// of the lease interval and renews early when a level's share is full or
// refused a connection while the cluster has room.
//
// Borrow (borrow.go) is the synchronous path for a connection refused by a
// full share after its handshake: bounded by cluster.borrowTimeout
// (default 20 ms) in all, it records the burst's demand and takes this
// member's part out of what the other members' leases leave, recording it
// in Redis before the share grows; when the slots it needs are held above
// their part by others it nudges them and tries again once they gave back.
//
// A lease also ends on the holder's clock: half an interval before a lease
// lifetime after the renewal was sent (Admission.SetShareDeadline), so that
// a paused process does not admit on a lease the others may already have
// re-taken, whatever runs first when it resumes.
//
// Shrinking is exact: the share is lowered locally first, and
// Admission.SetCapacity returns the open connections after it took effect;
// only then is the smaller lease, never below those, written.
//
// # Redis unreachable
//
// When two renewals in a row fail (an error or no answer within half a lease
// interval; one failure alone leaves the leases, which outlive it) every
// enforced level takes the configured fallback until Redis answers
// again: localShare, limit ÷ the live members as last seen (rounded down; at
// start, before any member was seen, this instance alone), failOpen, the
// whole limit here, failClosed, nothing. A share above the lease the
// instance held waits one lease lifetime: every other instance sees the
// outage within two lease intervals (a renewal each interval, each bounded
// by one), and until then may still use its lease. The change is logged once and
// counted (Status.Outages). When Redis answers again, no instance grows
// beyond its fallback share until every member it saw before the outage has
// renewed (and so recorded what it holds), or graceMax has passed (a member
// still missing then is taken for dead), so that the others never take the
// slots an instance still uses under its fallback share.
// localShare is exact when Redis is down for everybody; an instance cut off
// from Redis alone while the others still reach it can add its share to the
// limit until it sees Redis again (failClosed is exact in every case).
//
// # What is exact
//
// The limit holds cluster-wide as long as every instance renews within the
// lease lifetime (three intervals): renewals start an interval apart and
// each is bounded by half an interval. An instance stalled longer (a paused
// VM, a starved process), or cut off from Redis alone while the others
// still reach it, keeps the connections it has open (it admits no more on
// its expired lease, but under localShare it admits up to its fallback
// share while cut off), and the others may take those slots: the sum can
// then exceed the limit by that instance's share until it renews or its
// connections close. Under failClosed the others keep a silent member's
// slots one more lifetime (hold), so that a pause up to two lifetimes, or a
// partition whose open connections close within them, stays exact.
package cluster

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"weir/policy"
)

//go:embed alloc.lua
var allocSrc string

//go:embed lease.lua
var leaseSrc string

//go:embed leave.lua
var leaveSrc string

//go:embed borrow.lua
var borrowSrc string

//go:embed release.lua
var releaseSrc string

// The lease, borrow and release scripts share alloc.lua's split of a
// limit and its field parser.
var (
	leaseScript   = redis.NewScript(allocSrc + leaseSrc)
	leaveScript   = redis.NewScript(leaveSrc)
	borrowScript  = redis.NewScript(allocSrc + borrowSrc)
	releaseScript = redis.NewScript(allocSrc + releaseSrc)
)

// maxLimit bounds the limits sent to Redis: Lua numbers are doubles.
const maxLimit = 1 << 50

var quietRedis sync.Once

type voidLogger struct{}

func (voidLogger) Printf(context.Context, string, ...any) {}

// Options configure a Cluster.
type Options struct {
	// Config is the compiled cluster section (policy.Compile filled its
	// defaults).
	Config policy.Cluster
	// Admission is the admission state whose enforced connection limits
	// are shared.
	Admission *policy.Admission
	// Targets, when set, are the balancers' targets whose maxConnections
	// are shared the same way.
	Targets Targets
	// Logf, when set, receives the state changes: Redis lost and back.
	// Never called per connection.
	Logf func(format string, args ...any)
	// Started is reported to the other members; zero means time.Now().
	Started time.Time
}

// Targets is the balancers' side of the leases: every target with a
// maxConnections (WebSphere's MaxConnections is always enforced), whose
// slots are leased like an enforced level's. The appliance implements it
// over its balancers (balancer.Balancer.SetCapacity).
type Targets interface {
	// TargetLimits lists the targets with a maxConnections now.
	TargetLimits() []TargetLimit
	// SetTargetCapacity sets a target's share and returns its open
	// connections read after the share took effect (see
	// balancer.Balancer.SetCapacity); ok is false for an unknown target.
	SetTargetCapacity(service, target string, c int64) (open int64, ok bool)
	// SetDefaultTargetCapacity sets every target's share, present and
	// future, to c (< 0: none).
	SetDefaultTargetCapacity(c int64)
}

// TargetLimit is one target's limit and local state.
type TargetLimit struct {
	Service, Target string
	// Max is the target's maxConnections, cluster-wide.
	Max  int64
	Open int64 // connections open to it here
	// Refused counts the picks that passed it over at its share
	// (balancer.TargetStatus.SkippedAtShare): the demand the share did not
	// meet.
	Refused uint64
}

// Cluster is one instance's membership and leases. Loop runs it; Status may
// be called from any goroutine.
type Cluster struct {
	o      Options
	rdb    *redis.Client
	crdb   *redis.Client // the clients' admissions (clients.go): many at once, each bounded by borrowTimeout
	cs     clientState
	prefix string // "weir:{NAME}:"
	ttl    time.Duration

	outages atomic.Uint64
	renews  atomic.Uint64 // Redis round trips made
	// why counts the renewals by cause: periodic, early (wantsMore),
	// nudged; tests read it.
	why [3]atomic.Uint64

	recomputed chan struct{} // Recomputed's signal to bandwidthLoop
	bwRounds   atomic.Uint64 // bandwidth round trips made
	bwErrors   atomic.Uint64 // bandwidth publications that took the fallback
	bwMu       sync.Mutex    // guards the fields below; taken before mu
	bw         []Bandwidth   // as last shared
	logged     []LoggedConns // as last shared
	bwFails    int           // publications failed in a row
	bwKeys     []string      // the bandwidth hashes last written; by mu

	sampleRounds, sampleFails, sampleBad atomic.Uint64
	sampleMembers                        int    // members summed in the last shared sample; by mu
	sampleErr                            string // the last failed exchange's error; by mu

	// rt is held by the one lease round trip in flight (a renewal or a
	// borrow), taken before mu: a borrow waits for a renewal in flight at
	// most its timeout, never behind mu for a whole renewal.
	rt chan struct{}

	// nudge wakes Loop for an early renewal: another member published on
	// the cluster's nudge channel (it joined, left, is below its part
	// while this one holds slots above its own, or gave slots back).
	nudge   chan struct{}
	nudgeMu sync.Mutex
	nudged  chan struct{} // closed and replaced at each nudge: a borrow waits on it

	mu      sync.Mutex                        // guards the fields below and Loop's state
	levels  map[string]*lease                 // by Redis key
	byKey   atomic.Pointer[map[string]*lease] // a copy of levels, read without mu (Borrow)
	state   state
	st      Status
	members int // live members at the last renewal, ≥ 1
	// peakMembers is the most members a renewal saw within one lease
	// lifetime (ttl) of peakAt: what localShare divides by, so that a
	// member whose entry lapsed for a moment (a starved host) before the
	// outage still counts.
	peakMembers int
	peakAt      time.Time
	graceUntil  time.Time // after an outage: no growth beyond the fallback share until then,
	graceWait   []string  // or until these members, live before it, are back
	downAt      time.Time // when the current outage was seen
	fails       int       // renewals failed in a row
	leaseUntil  time.Time // the shares stand on leases that end then (zero: none)
	membersAt   time.Time // when the last renewal that read the members was sent
	closed      bool
}

// lease is one enforced level's local lease.
type lease struct {
	kind    policy.LevelKind
	name    string // the level's name; a target's service
	target  string // a target's name; "" for a level
	key     string
	limit   int64
	share   int64        // the capacity set in Admission; by mu
	cur     atomic.Int64 // share, read without mu (Borrow)
	refused uint64       // Admission's ShareRefused at the last renewal
	// refusedNow and open are Admission's figures read by this renewal.
	refusedNow uint64
	held       int64 // the cluster-wide sum of leases at the last renewal
	wants      int64 // the cluster-wide sum of wants at the last renewal
	record     int64 // the lease recorded in Redis for this instance
	// nudgeAt and nudgeDemand: when a borrow last nudged for this lease,
	// and with what demand.
	nudgeAt     time.Time
	nudgeDemand int64
	short       bool // at the last renewal another member was below its part
	spare       bool // at the last renewal another member held slots above its part
	open        int64
	gone        bool // no longer enforced: release at the next renewal
}

// setShare records the share set (setCap). Under mu.
func (l *lease) setShare(n int64) {
	l.share = n
	l.cur.Store(n)
}

type state uint8

const (
	stateStarting state = iota // no renewal answered yet
	stateShared
	stateDown
)

// Status is the cluster as this instance last saw it.
type Status struct {
	Name, Instance string
	// Redis is the server's address (a URL's password hidden).
	Redis string
	// Reachable: the last renewal succeeded.
	Reachable bool
	// Mode is "shared" (leases from Redis), or the fallback in force while
	// Redis is unreachable: "localShare", "failOpen" or "failClosed".
	Mode string
	// LastError is the last renewal's error, empty after a success.
	LastError string
	// Outages counts the times Redis became unreachable.
	Outages uint64
	// Renewals counts the lease round trips to Redis.
	Renewals uint64
	// BandwidthRounds counts the bandwidth round trips, BandwidthFallbacks
	// those that took the fallback (two or more in a row failed).
	BandwidthRounds, BandwidthFallbacks uint64
	Members                             []Member
	Levels                              []Level
	// Clients is the cluster-wide per-client counts' traffic (clients.go).
	Clients ClientsStatus
	// Bandwidth lists the levels with a maxBandwidth, judged on the
	// cluster's rate.
	Bandwidth []Bandwidth
	// Logged lists the levels whose maxConnections is only logged, with
	// the cluster's count the log line uses.
	Logged []LoggedConns
	// SampleRounds counts the sample exchanges, SampleFallbacks those that
	// failed (the instance judged its own samples), SampleMembers the
	// members summed in the last one that worked.
	SampleRounds, SampleFallbacks uint64
	SampleMembers                 int
	SampleError                   string
}

// Member is one live instance as the last renewal saw it.
type Member struct {
	ID      string
	Started time.Time
	// Seen is how long ago it last renewed (at most the lease lifetime).
	Seen time.Duration
}

// Level is one enforced level's local and cluster-wide figures, or one
// target's (Target set; Name is then its virtual server).
type Level struct {
	Kind   policy.LevelKind
	Name   string
	Target string
	Limit  int64 // the enforced maxConnections, cluster-wide
	// Share is this instance's share: the connections it may hold.
	Share int64
	// Open is this instance's open connections at the level.
	Open int64
	// Held is the sum of every member's leases at the last renewal (≥ the
	// cluster's open connections); meaningful only while Reachable.
	Held int64
	// Refused counts the connections refused here by the share.
	Refused uint64
}

// New connects to the configured Redis (lazily: New does no I/O) and sets
// every enforced level's share to zero until Loop's first renewal.
func New(o Options) (*Cluster, error) {
	if o.Admission == nil {
		return nil, errors.New("cluster: no admission state")
	}
	cfg := o.Config
	if cfg.Name == "" || cfg.Instance == "" || cfg.LeaseInterval <= 0 {
		return nil, errors.New("cluster: config not compiled (name, instance and leaseInterval needed)")
	}
	ro, err := redisOptions(cfg.Redis)
	if err != nil {
		return nil, err
	}
	// A renewal that takes longer than half a lease interval fails: two in
	// a row (Redis down) must end before the lease lifetime (three
	// intervals) does.
	ro.DialTimeout = cfg.LeaseInterval / 2
	ro.ReadTimeout = cfg.LeaseInterval / 2
	ro.WriteTimeout = cfg.LeaseInterval / 2
	ro.MaxRetries = -1
	ro.DialerRetries = 1 // Loop retries every renewal: no backoff inside one
	ro.PoolSize = 4      // leases, bandwidth, samples: one each, and a spare
	ro.DisableIdentity = true
	// The client's own log lines (a failed dial, every time) would bypass
	// the appliance's logger; the state changes are logged through Logf.
	quietRedis.Do(func() { redis.SetLogger(voidLogger{}) })
	if o.Started.IsZero() {
		o.Started = time.Now()
	}
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
	c := &Cluster{
		o:       o,
		rdb:     redis.NewClient(ro),
		prefix:  "weir:{" + cfg.Name + "}:",
		ttl:     policy.LeaseTTLFactor * cfg.LeaseInterval,
		levels:  map[string]*lease{},
		members: 1,

		recomputed: make(chan struct{}, 1),
		rt:         make(chan struct{}, 1),
		nudge:      make(chan struct{}, 1),
		nudged:     make(chan struct{}),
	}
	cro := *ro
	cro.PoolSize = 16
	cro.ReadTimeout, cro.WriteTimeout = cfg.BorrowTimeout, cfg.BorrowTimeout
	c.crdb = redis.NewClient(&cro)
	c.cs.init()
	c.st = Status{Name: cfg.Name, Instance: cfg.Instance, Redis: redactRedis(cfg.Redis), Mode: "starting"}
	o.Admission.SetDefaultCapacity(0)
	o.Admission.SetClientArbiter(c)
	if o.Targets != nil {
		o.Targets.SetDefaultTargetCapacity(0)
	}
	return c, nil
}

// redisOptions reads host:port or a redis:// URL.
func redisOptions(addr string) (*redis.Options, error) {
	if strings.Contains(addr, "://") {
		ro, err := redis.ParseURL(addr)
		if err != nil {
			return nil, fmt.Errorf("cluster: redis %q: %w", redactRedis(addr), err)
		}
		return ro, nil
	}
	return &redis.Options{Addr: addr}, nil
}

func redactRedis(addr string) string {
	i, j := strings.Index(addr, "://"), strings.LastIndex(addr, "@")
	if i < 0 || j < i {
		return addr
	}
	cred := addr[i+3 : j]
	if k := strings.IndexByte(cred, ':'); k >= 0 {
		return addr[:i+3] + cred[:k] + ":xxxxx" + addr[j:]
	}
	return addr
}

// Loop renews the membership and the leases every lease interval, and
// early when local demand outgrows a share or another member nudges,
// until ctx ends. It runs in its own goroutine; call it once.
func (c *Cluster) Loop(ctx context.Context) {
	interval := c.o.Config.LeaseInterval
	poll := max(interval/10, 5*time.Millisecond)
	// The nudges: subscribed before the first renewal, so that the
	// answers to this instance's joining are heard. Without them (no
	// answer in time) the renewals alone converge, an interval at a time.
	ps := c.rdb.Subscribe(ctx, c.nudgeChannel(), c.nudgeChannel()+":"+c.o.Config.Instance)
	sctx, cancel := context.WithTimeout(ctx, interval/2)
	_, err := ps.Receive(sctx)
	if err == nil {
		_, err = ps.Receive(sctx) // the second subscription's confirmation
	}
	cancel()
	if err != nil {
		c.o.Logf("cluster %s: no nudge subscription yet (%v): shares move at the renewals", c.st.Name, err)
	}
	psDone := make(chan struct{})
	go func() {
		defer close(psDone)
		c.nudgeLoop(ps.Channel())
	}()
	defer func() { ps.Close(); <-psDone }()
	tick := time.NewTicker(poll)
	defer tick.Stop()
	// Renewals start an interval apart (start to start, whatever each
	// took), so that with one lost answer the next still lands within the
	// lease lifetime.
	last := time.Now()
	c.Renew(ctx)
	bwDone := make(chan struct{})
	go func() {
		defer close(bwDone)
		c.bandwidthLoop(ctx)
	}()
	defer func() { <-bwDone }()
	clDone := make(chan struct{})
	go func() {
		defer close(clDone)
		c.clientsLoop(ctx)
	}()
	defer func() { <-clDone }()
	// A nudge renews at once, then no sooner than gap after the previous
	// nudged renewal: gap starts at a millisecond (more with many members)
	// and doubles, up to a poll, each time a nudged renewal moved no share, so that members
	// that keep nudging cannot make this one renew more than 10 times an
	// interval, while nudges that move slots are answered at once.
	// The first gap grows with the members (a millisecond each, up to a
	// poll): a nudge makes up to members − 1 renewals, each reading every
	// member, so that a storm of them (100 instances starting at once, a
	// release by each of 90 idle members) costs Redis O(members) renewals
	// per gap, not per nudge.
	minGap := func() time.Duration {
		c.mu.Lock()
		defer c.mu.Unlock()
		return min(max(time.Millisecond, time.Duration(c.members)*time.Millisecond), poll)
	}
	gap := minGap()
	// An early renewal (wantsMore) that moved no share doubles the wait
	// before the next early one, from a poll up to half an interval: a
	// demand the cluster cannot meet (contention, every slot in use)
	// would otherwise renew at every poll, and at 100 members those
	// renewals were most of Redis's work.
	earlyGap := poll
	var lastEarly time.Time
	var lastNudge time.Time
	var wake *time.Timer // a nudge that came within gap, answered at its end
	var wakeC <-chan time.Time
	// Slots recorded above a lowered share, for the connections still open
	// then, while another member is below its part, go back as those
	// connections close, not at the next renewal: every fast tick (5 ms)
	// while some are owed (for at most an interval after the renewal that lowered
	// the share) renews when connections closed since (closedOwed), which
	// records the smaller demand, lowers the share and releases. A burst
	// that moves from this member to another finds the slots of this one's
	// last connections within a few milliseconds of their close, inside
	// the other's borrowTimeout.
	fast := min(poll, 5*time.Millisecond)
	var owe *time.Ticker
	var oweC <-chan time.Time
	var oweUntil time.Time
	defer func() {
		if wake != nil {
			wake.Stop()
		}
		if owe != nil {
			owe.Stop()
		}
	}()
	renew := func(now time.Time) bool {
		moved := c.Renew(ctx)
		if c.owing() {
			oweUntil = now.Add(interval)
			if owe == nil {
				owe = time.NewTicker(fast)
			} else if oweC == nil {
				owe.Reset(fast)
			}
			oweC = owe.C
		}
		return moved
	}
	nudged := func(now time.Time) {
		lastNudge, last, wakeC = now, now, nil
		c.why[2].Add(1)
		if renew(now) {
			gap = minGap()
		} else {
			gap = min(2*gap, poll)
		}
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.nudge:
			now := time.Now()
			switch {
			case wakeC != nil:
			case now.Sub(lastNudge) >= gap:
				nudged(now)
			default:
				if wake == nil {
					wake = time.NewTimer(gap - now.Sub(lastNudge))
				} else {
					wake.Reset(gap - now.Sub(lastNudge))
				}
				wakeC = wake.C
			}
		case now := <-wakeC:
			nudged(now)
		case now := <-oweC:
			switch {
			case !c.owing() || now.After(oweUntil):
				owe.Stop()
				oweC = nil
			case c.closedOwed():
				c.why[1].Add(1)
				last = now
				renew(now)
			}
		case now := <-tick.C:
			if now.Sub(last) >= interval {
				c.why[0].Add(1)
				last = now
				renew(now)
			} else if now.Sub(lastEarly) >= earlyGap && c.wantsMore() {
				c.why[1].Add(1)
				last, lastEarly = now, now
				if renew(now) {
					earlyGap = poll
				} else {
					earlyGap = min(2*earlyGap, interval/2)
				}
			}
		}
	}
}

// membersKey is the hash of the live members: id -> "started expiry"
// (named "live": the set of ids an earlier weir kept under "members"
// holds another type).
func (c *Cluster) membersKey() string { return c.prefix + "live" }

// nudgeChannel is the Pub/Sub channel of the cluster's nudges to every
// member (one joined or left); a nudge to one member goes to its own
// channel, this name, a colon and its id, so that the others are not
// woken (at 100 members a nudge to all cost a wake-up in each).
func (c *Cluster) nudgeChannel() string { return c.prefix + "nudge" }

// nudgeLoop runs in its own goroutine until ch closes: each message from
// another member, on this member's own channel or the cluster's (a member
// joined or left), wakes Loop and every borrow waiting for slots.
func (c *Cluster) nudgeLoop(ch <-chan *redis.Message) {
	for m := range ch {
		if m.Payload == c.o.Config.Instance {
			continue
		}
		select {
		case c.nudge <- struct{}{}:
		default:
		}
		c.nudgeMu.Lock()
		close(c.nudged)
		c.nudged = make(chan struct{})
		c.nudgeMu.Unlock()
	}
}

// nudgedCh returns the channel the next nudge closes.
func (c *Cluster) nudgedCh() <-chan struct{} {
	c.nudgeMu.Lock()
	defer c.nudgeMu.Unlock()
	return c.nudged
}

// wantsMore reports whether a renewal is due before its interval: a
// level's share is full or refused a connection since the last renewal
// while the cluster has room (a slot free, or held above its part by a
// member that does not use it: the renewal nudges it); another member is below its part while this
// one's recorded lease is above what it uses (connections closed since);
// or the leases the shares stand on ended (a paused process resumed).
func (c *Cluster) wantsMore() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.state != stateShared {
		return false
	}
	if !c.leaseUntil.IsZero() && time.Now().After(c.leaseUntil) {
		return true
	}
	if c.inGrace() {
		return false
	}
	for _, d := range c.demands() {
		l := c.levels[d.key]
		if l == nil {
			continue
		}
		// Demand only: refusals, or a share filled by connections (an idle
		// share of zero is not demand).
		if (d.refused != l.refused || d.open > 0 && d.open >= l.share) && (l.held < l.limit || l.spare) {
			return true
		}
		if l.short && l.record > max(l.share, d.open) {
			return true
		}
		// Under contention, connections closed: record it, so that the
		// members waiting see the slots this one no longer uses.
		if l.wants > l.limit && d.open+max(2, l.open/4) <= l.open {
			return true
		}
	}
	return false
}

func enforced(s policy.LevelStat) bool {
	return !s.Retired && s.Limits.EnforceConnections && s.Limits.MaxConnections > 0
}

// demand is one shared limit's local state now: an enforced level's or a
// target's.
type demand struct {
	key          string
	kind         policy.LevelKind
	name, target string
	limit, open  int64
	refused      uint64
}

// demands reads every shared limit's local state: the enforced levels of
// Admission, then the targets with a maxConnections.
func (c *Cluster) demands() []demand {
	var out []demand
	for _, s := range c.o.Admission.Snapshot() {
		if enforced(s) {
			out = append(out, demand{key: c.levelKey("lease", s.Level, s.Name), kind: s.Level, name: s.Name,
				limit: s.Limits.MaxConnections, open: s.Conns, refused: s.ShareRefused})
		}
	}
	if c.o.Targets != nil {
		for _, t := range c.o.Targets.TargetLimits() {
			if t.Max > 0 {
				out = append(out, demand{key: c.targetKey(t.Service, t.Target),
					kind: policy.LevelVirtualServer, name: t.Service, target: t.Target,
					limit: t.Max, open: t.Open, refused: t.Refused})
			}
		}
	}
	return out
}

// setCap sets a lease's share locally: in Admission, or in the target's
// balancer. It returns the open connections read after the share took
// effect.
func (c *Cluster) setCap(l *lease, n int64) int64 {
	if l.target != "" {
		open, _ := c.o.Targets.SetTargetCapacity(l.name, l.target, n)
		return open
	}
	open, _ := c.o.Admission.SetCapacity(l.kind, l.name, n)
	return open
}

// targetKey is the Redis key of a target's lease.
func (c *Cluster) targetKey(service, target string) string {
	return c.prefix + "lease:target:" + service + "/" + target
}

// levelKey is the Redis key of what the cluster shares about one level:
// what is "lease" (the slots) or "bw" (the published rates).
func (c *Cluster) levelKey(what string, kind policy.LevelKind, name string) string {
	switch kind {
	case policy.LevelInstance:
		return c.prefix + what + ":instance"
	case policy.LevelClass:
		return c.prefix + what + ":class:" + name
	}
	return c.prefix + what + ":service:" + name
}

// Renew makes one renewal: the membership and every enforced level's lease
// in one script call, then the shares in Admission (a share that shrank is
// lowered first and its smaller lease recorded in a second call, so that
// the slots go back at this renewal); on failure, the fallback. Loop calls
// it; it is exported for tests and for a caller that wants the first
// leases before it serves. It reports whether a share moved.
func (c *Cluster) Renew(ctx context.Context) (moved bool) {
	select {
	case c.rt <- struct{}{}:
	case <-ctx.Done():
		return false
	}
	defer func() { <-c.rt }()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return false
	}
	start := time.Now()
	if !c.leaseUntil.IsZero() && start.After(c.leaseUntil) {
		c.expire()
	}
	seen := map[string]bool{}
	added := false
	for _, d := range c.demands() {
		seen[d.key] = true
		l := c.levels[d.key]
		if l == nil {
			l = &lease{kind: d.kind, name: d.name, target: d.target, key: d.key, refused: d.refused}
			c.levels[d.key] = l
		}
		l.gone = false
		l.limit = min(d.limit, maxLimit)
		added = added || c.byKeyMissing(d.key)
		l.open, l.refusedNow = d.open, d.refused
	}
	for k, l := range c.levels {
		if !seen[k] {
			l.gone = true
		}
	}
	if added {
		c.publishLevels()
	}
	// The membership is read (and this member's record in it renewed)
	// once an interval, and at every renewal until one succeeded.
	full := c.state != stateShared || start.Sub(c.membersAt) >= c.o.Config.LeaseInterval*3/4
	keys := []string{c.membersKey()}
	args := []any{c.o.Config.Instance, c.ttl.Milliseconds(), c.o.Started.UnixMilli(),
		c.hold().Milliseconds(), c.nudgeChannel(), map[bool]int{false: 0, true: 1}[full]}
	order := make([]*lease, 0, len(c.levels))
	for _, l := range c.levels {
		order = append(order, l)
	}
	slices.SortFunc(order, func(a, b *lease) int { return strings.Compare(a.key, b.key) })
	grace := c.state == stateDown || c.inGrace()
	for _, l := range order {
		want, floor, ceil := c.plan(l, grace)
		keys = append(keys, l.key)
		args = append(args, l.limit, want, floor, ceil, l.share, l.open)
	}
	rctx, cancel := context.WithTimeout(ctx, c.o.Config.LeaseInterval/2)
	defer cancel()
	res, err := leaseScript.Run(rctx, c.rdb, keys, args...).Slice()
	c.renews.Add(1)
	var back []*lease
	if err == nil {
		back, moved, err = c.apply(res, order)
	}
	if err != nil {
		c.fails++
		if c.fails < 2 && c.state == stateShared {
			// One slow or lost answer: the recorded leases outlive it (a
			// lifetime is three intervals), so keep them and retry.
			c.st.LastError = err.Error()
			return false
		}
		c.down(err)
		return false
	}
	c.fails = 0
	if full {
		c.membersAt = start
	}
	// The shares stand on leases Redis recorded to end a lifetime after it
	// ran the script, which was after start: this instance stops using
	// them a margin before that, on its own clock.
	c.leaseUntil = start.Add(c.ttl - c.o.Config.LeaseInterval/2)
	c.o.Admission.SetShareDeadline(c.leaseUntil)
	if len(back) > 0 {
		c.release(rctx, back)
	}
	removed := false
	for k, l := range c.levels {
		if l.gone {
			c.setCap(l, 0)
			delete(c.levels, k)
			removed = true
		}
	}
	if removed {
		c.publishLevels()
	}
	if c.state != stateShared {
		if c.state == stateDown {
			c.o.Logf("cluster %s: Redis %s reachable again: connection limits shared through leases", c.st.Name, c.st.Redis)
			c.graceUntil = time.Now().Add(c.graceMax())
			c.cs.down.Store(false)
			c.resumeClients()
		}
		c.state = stateShared
	}
	c.st.Reachable, c.st.Mode, c.st.LastError = true, "shared", ""
	return moved
}

// byKeyMissing reports whether the levels copy Borrow reads lacks key.
func (c *Cluster) byKeyMissing(key string) bool {
	m := c.byKey.Load()
	return m == nil || (*m)[key] == nil
}

// publishLevels copies levels for Borrow, after a level was added or
// removed. Under mu.
func (c *Cluster) publishLevels() {
	m := make(map[string]*lease, len(c.levels))
	for k, l := range c.levels {
		m[k] = l
	}
	c.byKey.Store(&m)
}

// hold is how long Redis keeps a lease whose member stopped renewing
// beyond its expiry, its slots still held: one more lifetime under
// failClosed, so that a paused member that resumes within it (and whose
// open connections were frozen, not closed) finds its slots still its
// own; none otherwise (a dead member's slots are free after one lifetime).
func (c *Cluster) hold() time.Duration {
	if c.o.Config.OnRedisDown == policy.FailClosed {
		return c.ttl
	}
	return 0
}

// expire drops every share to zero: the leases they stood on ended
// before this instance could renew them (it was paused, or starved).
// Admission already admits nothing on them (SetShareDeadline); this sets
// the targets' shares too and lets the next renewal record only the
// connections still open. Under mu.
func (c *Cluster) expire() {
	for _, l := range c.levels {
		if l.share != 0 {
			c.setCap(l, 0)
			l.setShare(0)
		}
	}
	c.leaseUntil = time.Time{}
}

// release records the smaller leases of the levels whose share apply
// lowered (the share is already lowered, so each still bounds what is in
// use), and nudges the members below their part (a member that joined and
// has no lease yet is one). A failure leaves the
// larger record, which only over-states what this instance holds until
// the next renewal. Under mu, with the round trip held.
func (c *Cluster) release(ctx context.Context, back []*lease) {
	keys := make([]string, 0, len(back))
	channel := "" // nobody below its part: nobody to tell
	for _, l := range back {
		if l.short {
			channel = c.nudgeChannel()
		}
	}
	args := []any{c.o.Config.Instance, channel}
	for _, l := range back {
		keys = append(keys, l.key)
		args = append(args, l.limit, max(l.share, l.open))
	}
	c.renews.Add(1)
	if err := releaseScript.Run(ctx, c.rdb, keys, args...).Err(); err != nil {
		return
	}
	for _, l := range back {
		l.held -= l.record - max(l.share, l.open)
		l.record = max(l.share, l.open)
	}
}

// owing reports whether a lease is recorded above its share (the
// connections open when apply lowered it) while another member is below
// its part: what the fast ticks of Loop wait on.
func (c *Cluster) owing() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.owingLocked()
}

func (c *Cluster) owingLocked() bool {
	if c.state != stateShared {
		return false
	}
	for _, l := range c.levels {
		if l.short && l.record > l.share {
			return true
		}
	}
	return false
}

// closedOwed reports whether a level owing slots (owing) has fewer
// connections open than when its share was lowered: a renewal now
// records the smaller demand and lease, and gives the slots back.
func (c *Cluster) closedOwed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || !c.owingLocked() {
		return false
	}
	for _, d := range c.demands() {
		if l := c.levels[d.key]; l != nil && l.short && l.record > l.share && d.open < l.open {
			return true
		}
	}
	return false
}

// inGrace reports whether Redis came back lately and a member seen before
// the outage has not renewed since (it may still enforce its fallback
// share without a lease recorded). Under mu.
func (c *Cluster) inGrace() bool {
	if c.graceWait == nil {
		return false
	}
	if time.Now().After(c.graceUntil) {
		c.graceWait = nil
		return false
	}
	for _, id := range c.graceWait {
		if !slices.ContainsFunc(c.st.Members, func(m Member) bool { return m.ID == id }) {
			return true
		}
	}
	c.graceWait = nil
	return false
}

// graceMax bounds the grace after an outage: a member that has not
// renewed by then is taken for dead. It covers the lease lifetime and the
// Redis client's reconnect probe (one a second once dials failed).
func (c *Cluster) graceMax() time.Duration {
	return max(c.ttl, 2*time.Second) + c.o.Config.LeaseInterval
}

// plan works out a level's want, floor and ceiling for a renewal: want
// is the slots the local demand asks for (the script adds this
// instance's part of what the demands leave free, or splits the limit in
// proportion to the demands), floor bounds the connections the level may
// hold whatever the answer (the lease is never recorded below it), and no
// grant exceeds ceil. Under mu.
func (c *Cluster) plan(l *lease, grace bool) (want, floor, ceil int64) {
	if l.gone {
		return -1, 0, 0
	}
	cur := l.share
	// Connections above the share cannot be added (SetCapacity's bound), so
	// the open count read after the share was set bounds them from now on.
	floor = max(cur, l.open)
	// The demand: the connections open and those the share refused since
	// the last renewal (the script adds the spare).
	delta := int64(min(l.refusedNow-l.refused, maxLimit))
	l.refused = l.refusedNow
	want = min(l.limit, l.open+delta)
	ceil = l.limit
	if grace {
		// The fallback share as during the outage: with the members seen
		// before it, not the fewer that have renewed since.
		share := c.fallbackShare(l)
		if c.o.Config.OnRedisDown == policy.LocalShare {
			share = l.limit / int64(max(c.fallbackMembers(), len(c.graceWait)))
		}
		ceil = max(min(cur, l.limit), share)
	}
	return want, floor, ceil
}

// fallbackShare is a level's share while Redis is unreachable.
func (c *Cluster) fallbackShare(l *lease) int64 {
	switch c.o.Config.OnRedisDown {
	case policy.FailOpen:
		return l.limit
	case policy.FailClosed:
		return 0
	}
	return l.limit / int64(c.fallbackMembers())
}

// setMembers records the members a renewal saw. Under mu.
func (c *Cluster) setMembers(n int) {
	c.members = max(n, 1)
	if now := time.Now(); c.members >= c.peakMembers || now.Sub(c.peakAt) > c.ttl {
		c.peakMembers, c.peakAt = c.members, now
	}
}

// fallbackMembers is what localShare divides a limit by: the most members
// seen within a lease lifetime before the last renewal (an outage does
// not age it: no renewal sees members leave then). Under mu.
func (c *Cluster) fallbackMembers() int {
	return max(c.members, c.peakMembers, 1)
}

// apply reads the script's answer: the members, then grant, record, the
// cluster-wide sums of leases and wants and whether another member is
// short, per level, and sets the shares. It returns the levels whose
// share it lowered below their record, for release. Under mu.
func (c *Cluster) apply(res []any, order []*lease) (back []*lease, moved bool, err error) {
	num := func(i int) (int64, error) {
		if i >= len(res) {
			return 0, fmt.Errorf("cluster: short answer from the lease script (%d values)", len(res))
		}
		switch v := res[i].(type) {
		case int64:
			return v, nil
		case string:
			return strconv.ParseInt(v, 10, 64)
		}
		return 0, fmt.Errorf("cluster: lease script value %d is %T", i, res[i])
	}
	n, err := num(0)
	if err != nil {
		return nil, false, err
	}
	const per = 6 // values per level
	// n = -1: the members were not read (see Renew's full), their count
	// follows.
	head := 1 + 3*int(max(n, 0))
	if n == -1 {
		head = 2
	}
	if n < -1 || len(res) != head+per*len(order) {
		return nil, false, fmt.Errorf("cluster: lease script answered %d values for %d members and %d levels", len(res), n, len(order))
	}
	if n == -1 {
		count, err := num(1)
		if err != nil {
			return nil, false, err
		}
		c.setMembers(int(count))
	} else {
		members := make([]Member, 0, n)
		for i := range int(n) {
			id, _ := res[1+3*i].(string)
			started, err1 := num(2 + 3*i)
			left, err2 := num(3 + 3*i)
			if err := errors.Join(err1, err2); err != nil {
				return nil, false, err
			}
			members = append(members, Member{ID: id, Started: time.UnixMilli(started), Seen: max(c.ttl-time.Duration(left)*time.Millisecond, 0)})
		}
		slices.SortFunc(members, func(a, b Member) int { return strings.Compare(a.ID, b.ID) })
		c.st.Members = members
		c.setMembers(len(members))
	}
	base := head
	for i, l := range order {
		grant, err1 := num(base + per*i)
		record, err2 := num(base + per*i + 1)
		held, err3 := num(base + per*i + 2)
		wants, err4 := num(base + per*i + 3)
		short, err5 := num(base + per*i + 4)
		spare, err6 := num(base + per*i + 5)
		if err := errors.Join(err1, err2, err3, err4, err5, err6); err != nil {
			return nil, false, err
		}
		l.held, l.wants, l.record, l.short, l.spare = held, wants, record, short != 0, spare != 0
		// A borrow after this renewal tells its demand again: what the
		// members nudged before gave back is settled (bursts 10 ms apart
		// were refused for want of a nudge held back by the last one's).
		l.nudgeAt, l.nudgeDemand = time.Time{}, 0
		if l.gone || grant == l.share {
			continue
		}
		// Lowered first, then recorded (release); raised after Redis
		// recorded it.
		moved = true
		open := c.setCap(l, grant)
		l.setShare(grant)
		l.open = open
		if max(grant, open) < record {
			back = append(back, l)
		}
	}
	return back, moved, nil
}

// down applies the fallback after a failed renewal. Under mu.
func (c *Cluster) down(err error) {
	mode := c.o.Config.OnRedisDown
	if c.state != stateDown {
		c.outages.Add(1)
		c.o.Logf("cluster %s: Redis %s unreachable (%v): %s with %d members as last seen, until it answers",
			c.st.Name, c.st.Redis, err, mode, c.fallbackMembers())
		c.state = stateDown
		c.cs.down.Store(true)
		c.downAt = time.Now()
		c.graceUntil = time.Now().Add(24 * time.Hour) // set to graceMax when Redis answers
		c.graceWait = make([]string, 0, len(c.st.Members))
		for _, m := range c.st.Members {
			c.graceWait = append(c.graceWait, m.ID)
		}
	}
	c.st.Reachable, c.st.Mode, c.st.LastError = false, mode.String(), err.Error()
	// The fallback shares stand on no lease: no deadline (failClosed's
	// are 0 anyway). A share that stood on a lease that already ended is
	// 0 before the fallback applies.
	if !c.leaseUntil.IsZero() && time.Now().After(c.leaseUntil) {
		c.expire()
	}
	c.leaseUntil = time.Time{}
	c.o.Admission.SetShareDeadline(time.Time{})
	removed := false
	defer func() {
		if removed {
			c.publishLevels()
		}
	}()
	for k, l := range c.levels {
		if l.gone {
			c.setCap(l, 0)
			delete(c.levels, k)
			removed = true
			continue
		}
		share := c.fallbackShare(l)
		settled := time.Since(c.downAt) >= c.ttl
		if !settled {
			// The others may still hold their leases: until every one of
			// them has seen the outage too (within two intervals of ours)
			// nobody grows past its lease.
			share = min(share, l.share)
		}
		capacity := share
		if mode == policy.FailOpen && settled {
			capacity = -1 // the limit alone
		}
		if share != l.share {
			c.setCap(l, capacity)
			l.setShare(share)
		}
		l.held = 0
	}
}

// Status returns the cluster as this instance last saw it.
func (c *Cluster) Status() Status {
	bw, logged := c.bandwidthStatus()
	c.mu.Lock()
	defer c.mu.Unlock()
	st := c.st
	st.Bandwidth, st.Logged = bw, logged
	st.BandwidthRounds, st.BandwidthFallbacks = c.bwRounds.Load(), c.bwErrors.Load()
	st.SampleRounds, st.SampleFallbacks, st.SampleMembers, st.SampleError = c.sampleRounds.Load(), c.sampleFails.Load(), c.sampleMembers, c.sampleErr
	st.Members = slices.Clone(c.st.Members)
	st.Outages, st.Renewals = c.outages.Load(), c.renews.Load()
	st.Clients = c.cs.status()
	refused := map[string]uint64{}
	open := map[string]int64{}
	for _, d := range c.demands() {
		refused[d.key], open[d.key] = d.refused, d.open
	}
	for _, l := range c.levels {
		if l.gone {
			continue
		}
		st.Levels = append(st.Levels, Level{Kind: l.kind, Name: l.name, Target: l.target, Limit: l.limit, Share: l.share,
			Open: open[l.key], Held: l.held, Refused: refused[l.key]})
	}
	slices.SortFunc(st.Levels, func(a, b Level) int {
		if (a.Target != "") != (b.Target != "") {
			if a.Target != "" {
				return 1
			}
			return -1
		}
		if a.Kind != b.Kind {
			return int(a.Kind) - int(b.Kind)
		}
		if a.Name != b.Name {
			return strings.Compare(a.Name, b.Name)
		}
		return strings.Compare(a.Target, b.Target)
	})
	return st
}

// Close gives this instance's slots back and leaves the membership (best
// effort, within one lease interval: a lease it could not give back expires
// on its own), closes the Redis client and removes the shares from
// Admission, whose limits then apply to this instance alone. Renew does
// nothing afterwards. Call it after Loop has returned.
func (c *Cluster) Close() error {
	c.bwMu.Lock()
	for _, l := range c.bw {
		c.o.Admission.SetRemoteBandwidth(l.Kind, l.Name, 0)
	}
	for _, l := range c.logged {
		c.o.Admission.SetRemoteConns(l.Kind, l.Name, 0)
	}
	c.bw, c.logged = nil, nil
	c.bwMu.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	keys := []string{c.membersKey()}
	for _, l := range c.levels {
		keys = append(keys, l.key)
	}
	keys = append(keys, c.bwKeys...)
	c.o.Admission.SetClientArbiter(nil)
	ctx, cancel := context.WithTimeout(context.Background(), c.o.Config.LeaseInterval)
	err := leaveScript.Run(ctx, c.rdb, keys, c.o.Config.Instance, c.nudgeChannel()).Err()
	err = errors.Join(err, c.leaveClients(ctx))
	cancel()
	c.o.Admission.SetDefaultCapacity(-1)
	c.o.Admission.SetShareDeadline(time.Time{})
	if c.o.Targets != nil {
		c.o.Targets.SetDefaultTargetCapacity(-1)
	}
	return errors.Join(err, c.rdb.Close(), c.crdb.Close())
}
