// Package bench is weir's end-to-end benchmark harness and load generator. It
// drives weir through its public APIs; micro-benchmarks live beside their
// code as go test -bench.
package bench
