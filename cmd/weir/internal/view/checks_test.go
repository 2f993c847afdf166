package view

import (
	"strings"
	"testing"
	"time"

	"weir/cmd/weir/api"
)

// TestWriteTableHealthChecks: each checked target's last check, its
// reason and the count toward rise or fall are shown; a change names the
// reason.
func TestWriteTableHealthChecks(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	st := sample()
	st.Services[0].Balancer, st.Services[0].HashBy = "maglev", "header:X-User"
	tg := st.Services[0].Targets
	tg[0].Check = &api.HealthCheck{At: at, OK: false, Reason: "status 503", Streak: 2, Need: 3}
	tg[1].HealthUp = false
	tg[1].Check = &api.HealthCheck{At: at, OK: true, Streak: 1, Need: 2}
	var b strings.Builder
	if err := WriteTable(&b, st); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"web (http 198.18.0.80 port 80, maglev by header:X-User), 2 refused",
		"CHECK  LAST      RESULT              TOWARD\n",
		"  t1     03:04:05  failed: status 503  fall 2/3\n",
		"  t2     03:04:05  ok                  rise 1/2\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in\n%s", want, out)
		}
	}
	if strings.Contains(tableString(t, sample()), "CHECK") {
		t.Errorf("a status without checks shows the CHECK table")
	}

	prev := sample()
	cur := sample()
	cur.Services[0].Targets[0].HealthUp = false
	cur.Services[0].Targets[0].Check = &api.HealthCheck{At: at, Reason: "expect mismatch", Need: 2}
	found := false
	for _, l := range Changes(prev, cur) {
		if strings.Contains(l, "t1: health check fails (expect mismatch)") {
			found = true
		}
	}
	if !found {
		t.Errorf("changes %q name no reason", Changes(prev, cur))
	}
}

func tableString(t *testing.T, st api.Status) string {
	t.Helper()
	var b strings.Builder
	if err := WriteTable(&b, st); err != nil {
		t.Fatal(err)
	}
	return b.String()
}
