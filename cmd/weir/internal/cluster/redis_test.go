package cluster

import (
	"testing"

	"go.uber.org/goleak"

	"weir/cmd/weir/internal/cluster/clustertest"
	"weir/internal/testutil"
)

// TestMain checks for leaked goroutines. go-redis's dial prober, started
// after failed dials (Redis killed), sleeps a second before it sees the
// closed pool and ends: it outlives Close by at most that second.
func TestMain(m *testing.M) {
	testutil.VerifyNoLeaks(m, goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial"))
}

func startRedis(t *testing.T) *clustertest.Redis { return clustertest.StartRedis(t) }
