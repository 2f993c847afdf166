//go:build race

package testutil

// Race is true when the tests run under the race detector: timing-bound
// checks relax or skip on a stack slowed several times over.
const Race = true
