// Package balancer is weir's weighted distributor: targets with a WLM weight
// and an effective weight after the QoS fraction, smooth weighted round robin
// (default), weighted least connections and Maglev consistent hashing,
// MaxConnections per target, primary and backup lists, down-state after a
// failed connect, the rise/fall state of active health checks it does not
// run itself (ReportHealth takes each verdict; cmd/weir/internal/health
// dials them) and slow start. Tables are immutable and
// swapped atomically; connection counts and down-state carry over by target
// name.
//
// PickAction does not allocate. balancer imports the standard library and policy
// types only: never a logger, YAML, encoding/json, flag or gVisor.
//
// One Balancer serves one virtual server:
//
//   - New builds it from a *policy.VirtualServer and policy.BalancerSettings;
//     Update swaps in a reloaded configuration; SetFractions the QoS
//     fractions of a sample, one set per service level (the default level
//     and each policy action), balanced exactly on WLM weight × (100 −
//     fraction); SetWeights whole effective weights computed elsewhere.
//   - PickAction (with a Tried, for retries bounded by MaxAttempts; with a
//     policy action, on that service level's weights) reserves a slot
//     on a target and returns a Lease; Lease.Release gives it back when the
//     connection closes, Lease.Failed when the connect failed (the target is
//     then down for the retry interval). When no target can serve, PickAction
//     returns a *NoTargetError whose message names each target and why: the
//     503 page text and the log line.
//   - ReportHealth feeds active health-check results through the rise/fall
//     state machine (Health); the balancer never dials: the control plane
//     runs the checks (cmd/weir/internal/health) and reports each verdict.
//   - Snapshot returns every target's weights, open connections, down-state,
//     health, slow-start factor and counters for the admin API.
//
// Weight 0: a primary the QoS cut to 0 gets no connection while another
// primary can take it, but takes them, before any backup, when none can; a
// primary configured with weight 0 is draining: the backups serve first and
// it takes a connection only when nothing else can.
//
// Time is always passed in, so tests drive a manual clock, and nothing here
// logs: events such as "target at its limit, not selected" are counters
// (TargetStatus.SkippedAtLimit) the control plane reads and reports.
package balancer
