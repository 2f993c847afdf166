//go:build !linux

package datapath

import "time"

// threadCPU is only measured on Linux; elsewhere it reports zero.
func threadCPU() func() time.Duration { return func() time.Duration { return 0 } }
