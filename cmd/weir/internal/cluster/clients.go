package cluster

import (
	"context"
	_ "embed"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"weir/policy"
)

// Per-client connection limits, cluster-wide (policy.ClientArbiter).
//
// Each member records, per scope with an enforced per-client
// maxConnections (a virtual server, or the instance), its own count of each
// client with a connection open there: a hash per member and scope, client
// -> "seq:n", that lives a lease lifetime past the member's last write or
// refresh (refreshed every lease interval while it holds clients). A
// connection the member's own client table admitted is asked of Redis at
// once, one round trip bounded by cluster.borrowTimeout (clients.lua): the
// other live members' counts of the client plus this member's, this
// connection included, must stay within the limit, and the new count is
// recorded in the same script. A release is recorded afterwards, batched
// (clientswrite.lua), so the others may see a client's slot in use a few
// milliseconds after it closed, never the reverse: the limit is exact.
// Counts are absolute and ordered by a sequence number taken with them, so
// that a write overtaken by a newer one is ignored and a lost write is
// mended by the next.
//
// Redis down (the renewals' outage), an error or no answer within the
// timeout: under failClosed the connection is refused, naming the client
// and the cluster; under localShare and failOpen it is judged by this
// member's table alone (the per-client limit holds per instance, as
// without a cluster), and the count is recorded once Redis answers. A
// member that stalls past a lease lifetime loses its counts in Redis, as
// its leases (the others may then admit its clients' slots), and writes
// them all again when it resumes. A client's bandwidth and a per-client
// limit only logged stay per instance.

//go:embed clients.lua
var clientsSrc string

//go:embed clientswrite.lua
var clientsWriteSrc string

var (
	clientsScript      = redis.NewScript(clientsSrc)
	clientsWriteScript = redis.NewScript(clientsWriteSrc)
)

// clientRef is one client at one scope, as policy names them.
type clientRef struct{ scope, client string }

// clientState is the cluster's side of the per-client counts.
type clientState struct {
	down atomic.Bool // the renewals see Redis unreachable (stateDown)

	admits, refused, fallbacks, errors, writes atomic.Uint64

	mu     sync.Mutex
	dirty  map[clientRef]struct{} // counts to record
	scopes map[string]bool        // scopes recorded at: refreshed every interval
	wake   chan struct{}
}

func (s *clientState) init() {
	s.dirty = map[clientRef]struct{}{}
	s.scopes = map[string]bool{}
	s.wake = make(chan struct{}, 1)
}

// clientsKey is this member's (or id's) counts hash at scope.
func (c *Cluster) clientsKey(scope, id string) string { return c.clientsBase(scope) + id }

// clientsBase is the prefix of every member's counts hash at scope.
func (c *Cluster) clientsBase(scope string) string {
	if scope == "" {
		return c.prefix + "clients:instance:"
	}
	return c.prefix + "clients:vs:" + scope + ":"
}

// Admit implements policy.ClientArbiter.
func (c *Cluster) Admit(scope, client string, n, seq, limit int64) (others int64, ok bool) {
	cs := &c.cs
	if !cs.down.Load() {
		ctx, cancel := context.WithTimeout(context.Background(), c.o.Config.BorrowTimeout)
		res, err := clientsScript.Run(ctx, c.crdb, []string{c.membersKey(), c.clientsKey(scope, c.o.Config.Instance)},
			c.o.Config.Instance, c.clientsBase(scope), client, n, seq, limit, c.ttl.Milliseconds()).Int64Slice()
		cancel()
		if err == nil && len(res) == 2 {
			cs.noteScope(scope)
			if res[0] == 1 {
				cs.admits.Add(1)
				return res[1], true
			}
			cs.refused.Add(1)
			return res[1], false
		}
		cs.errors.Add(1)
	}
	// Not asked: the count is recorded when Redis answers (and one the
	// script may have recorded after the timeout is mended then).
	cs.fallbacks.Add(1)
	cs.markDirty(clientRef{scope, client})
	if c.o.Config.OnRedisDown == policy.FailClosed {
		return -1, false
	}
	return 0, true
}

// Changed implements policy.ClientArbiter.
func (c *Cluster) Changed(scope, client string) { c.cs.markDirty(clientRef{scope, client}) }

func (s *clientState) markDirty(r clientRef) {
	s.mu.Lock()
	s.dirty[r] = struct{}{}
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *clientState) noteScope(scope string) {
	s.mu.Lock()
	s.scopes[scope] = true
	s.mu.Unlock()
}

// clientsLoop records the changed counts as they come (batched: one round
// trip per scope for what changed meanwhile) and refreshes this member's
// counts hashes every lease interval, until ctx ends.
func (c *Cluster) clientsLoop(ctx context.Context) {
	tick := time.NewTicker(c.o.Config.LeaseInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.cs.wake:
			c.flushClients(ctx)
		case <-tick.C:
			c.refreshClients(ctx)
			c.flushClients(ctx)
		}
	}
}

// flushClients records the dirty counts. On failure they stay dirty and
// are tried again at the next change or interval.
func (c *Cluster) flushClients(ctx context.Context) {
	cs := &c.cs
	if cs.down.Load() {
		return
	}
	cs.mu.Lock()
	if len(cs.dirty) == 0 {
		cs.mu.Unlock()
		return
	}
	batch := cs.dirty
	cs.dirty = make(map[clientRef]struct{}, len(batch))
	cs.mu.Unlock()
	byScope := map[string][]any{}
	for r := range batch {
		n, seq := c.o.Admission.ClientCount(r.scope, r.client)
		args := byScope[r.scope]
		if args == nil {
			args = []any{c.ttl.Milliseconds()}
		}
		byScope[r.scope] = append(args, r.client, n, seq)
	}
	for scope, args := range byScope {
		rctx, cancel := context.WithTimeout(ctx, c.o.Config.LeaseInterval/2)
		err := clientsWriteScript.Run(rctx, c.rdb, []string{c.clientsKey(scope, c.o.Config.Instance)}, args...).Err()
		cancel()
		cs.writes.Add(1)
		if err != nil {
			cs.errors.Add(1)
			cs.mu.Lock()
			for j := 1; j < len(args); j += 3 {
				cs.dirty[clientRef{scope, args[j].(string)}] = struct{}{}
			}
			cs.mu.Unlock()
			continue
		}
		cs.noteScope(scope)
	}
}

// refreshClients extends the life of this member's counts hashes; one
// that is gone (a stall past its lifetime, an outage, a flushed Redis)
// while clients are open here is written again in full.
func (c *Cluster) refreshClients(ctx context.Context) {
	cs := &c.cs
	if cs.down.Load() {
		return
	}
	scopes := cs.scopeList()
	if len(scopes) == 0 {
		return
	}
	rctx, cancel := context.WithTimeout(ctx, c.o.Config.LeaseInterval/2)
	defer cancel()
	pipe := c.rdb.Pipeline()
	cmds := make([]*redis.BoolCmd, len(scopes))
	for i, s := range scopes {
		cmds[i] = pipe.PExpire(rctx, c.clientsKey(s, c.o.Config.Instance), c.ttl)
	}
	if _, err := pipe.Exec(rctx); err != nil && err != redis.Nil {
		cs.errors.Add(1)
		return
	}
	for i, s := range scopes {
		if cmds[i].Val() {
			continue
		}
		active := c.o.Admission.ClientsActive(s)
		cs.mu.Lock()
		if len(active) == 0 {
			delete(cs.scopes, s) // nothing recorded, nothing to keep alive
		}
		for _, cl := range active {
			cs.dirty[clientRef{s, cl}] = struct{}{}
		}
		cs.mu.Unlock()
	}
}

// resumeClients marks every open client dirty after an outage: what
// changed while Redis was down is recorded at the next flush.
func (c *Cluster) resumeClients() {
	for _, s := range c.cs.scopeList() {
		for _, cl := range c.o.Admission.ClientsActive(s) {
			c.cs.markDirty(clientRef{s, cl})
		}
	}
}

// scopeList is the scopes this member has counted clients in.
func (s *clientState) scopeList() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Collect(maps.Keys(s.scopes))
}

// leaveClients deletes this member's counts (Close).
func (c *Cluster) leaveClients(ctx context.Context) error {
	var keys []string
	for _, s := range c.cs.scopeList() {
		keys = append(keys, c.clientsKey(s, c.o.Config.Instance))
	}
	if len(keys) == 0 {
		return nil
	}
	return c.rdb.Del(ctx, keys...).Err()
}

// ClientsStatus is the cluster-wide client counts' traffic with Redis.
type ClientsStatus struct {
	// Admitted and Refused count the connections Redis judged; Fallbacks
	// those judged without it (Redis down, an error or no answer in time:
	// the onRedisDown fallback); Errors the failed round trips; Writes the
	// batched records of released counts.
	Admitted, Refused, Fallbacks, Errors, Writes uint64
	// Pending is the counts not yet recorded.
	Pending int
}

func (s *clientState) status() ClientsStatus {
	s.mu.Lock()
	pending := len(s.dirty)
	s.mu.Unlock()
	return ClientsStatus{Admitted: s.admits.Load(), Refused: s.refused.Load(), Fallbacks: s.fallbacks.Load(),
		Errors: s.errors.Load(), Writes: s.writes.Load(), Pending: pending}
}
