// Package balancer is weir's weighted distributor: targets with a WLM weight
// and an effective weight after the QoS fraction, smooth weighted round robin
// (default), weighted least connections and Maglev consistent hashing,
// MaxConnections per target, primary and backup lists, down-state after a
// failed connect, health checks and slow start. Tables are immutable and
// swapped atomically; connection counts and down-state carry over by target
// name.
//
// Pick does not allocate. balancer imports the standard library and policy
// types only: never a logger, YAML, encoding/json, flag or gVisor.
package balancer
