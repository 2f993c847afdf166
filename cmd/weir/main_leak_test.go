package main

import (
	"testing"

	"weir/internal/testutil"
)

// TestMain fails the unit suite if a test left a goroutine running (the
// in-process commands, the Reloader's watch, the lab it reloads).
func TestMain(m *testing.M) { testutil.VerifyNoLeaks(m) }
