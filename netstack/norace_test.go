//go:build !race

package netstack

// raceEnabled relaxes timing checks under the race detector.
const raceEnabled = false
