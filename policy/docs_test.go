package policy

import (
	"os"
	"strings"
	"testing"
)

// TestDocLogLines: the log-line examples of docs/operations.md (Logs) are
// what the control plane writes ("qos: " + Event.String()).
func TestDocLogLines(t *testing.T) {
	b, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range []Event{
		{Level: LevelVirtualServer, Name: "web", Limit: LimitMaxConnections, Value: 2, Measured: 3, Over: true},
		{Level: LevelVirtualServer, Name: "web", Limit: LimitMaxConnections, Value: 2, Measured: 2},
	} {
		if line := "`qos: " + e.String() + "`"; !strings.Contains(string(b), line) {
			t.Errorf("docs/operations.md lacks the log line the code writes: %s", line)
		}
	}
}
