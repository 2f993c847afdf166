package policy

import (
	"testing"
	"time"
)

// TestEventsOncePerCrossing checks that a limit that is only logged yields
// one event when crossed and one when back under, not one per connection.
func TestEventsOncePerCrossing(t *testing.T) {
	cfg := limitsCfg{
		web:    Limits{MaxConnections: 2, MaxBandwidth: 100},
		metric: time.Second,
	}.build(t)
	a := NewAdmission(cfg, 0)
	src := &testBytes{}
	web := cfg.ServiceByName("web")
	t0 := time.Unix(100, 0)
	a.Recompute(t0, src)
	tickets := make([]Ticket, 6)
	for i := range tickets {
		if r, ok := a.Admit(web, &tickets[i]); !ok {
			t.Fatalf("not-enforced limit refused: %v", r)
		}
	}
	ev := drain(a)
	want := Event{At: t0, Level: LevelVirtualServer, Name: "web", Limit: LimitMaxConnections, Value: 2, Measured: 3, Over: true}
	if len(ev) != 1 || ev[0] != want {
		t.Fatalf("after 6 connections over a limit of 2: %v, want just %v", ev, want)
	}
	if got, w := ev[0].String(), `virtual server "web": maxConnections 2 reached (3 open), not enforced`; got != w {
		t.Errorf("event text %q, want %q", got, w)
	}
	a.Recompute(t0.Add(100*time.Millisecond), src)
	if ev := drain(a); len(ev) != 0 {
		t.Fatalf("recompute while still over: %v", ev)
	}
	for i := 0; i < 4; i++ {
		tickets[i].Release()
	}
	a.Recompute(t0.Add(200*time.Millisecond), src)
	ev = drain(a)
	if len(ev) != 1 || ev[0].Over || ev[0].Measured != 2 || ev[0].Limit != LimitMaxConnections {
		t.Fatalf("back at 2 connections: %v, want one under event", ev)
	}
	if got, w := ev[0].String(), `virtual server "web": back under maxConnections 2 (2 open)`; got != w {
		t.Errorf("event text %q, want %q", got, w)
	}

	// Bandwidth: 500 bytes in a 1 s window is 500 B/s, over 100 for as long
	// as the sample is in the window, then back under: two events.
	src.add("web", 500)
	var bw []Event
	for at := 300 * time.Millisecond; at <= 3*time.Second; at += 100 * time.Millisecond {
		a.Recompute(t0.Add(at), src)
		bw = append(bw, drain(a)...)
	}
	if len(bw) != 2 || !bw[0].Over || bw[0].Limit != LimitMaxBandwidth || bw[0].Measured != 500 ||
		bw[1].Over || bw[1].Measured != 0 || !bw[1].At.Equal(t0.Add(1300*time.Millisecond)) {
		t.Fatalf("bandwidth events %v, want one over at 500 B/s and one under at 1.3 s, when the sample is 1 s old", bw)
	}
	if st := stat(t, a, LevelVirtualServer, "web"); st.OverBandwidth || st.OverConns {
		t.Errorf("snapshot still over: %+v", st)
	}
}

func TestEventsBufferBounded(t *testing.T) {
	cfg := limitsCfg{web: Limits{MaxConnections: 1}, api: Limits{MaxConnections: 1}, misc: Limits{MaxConnections: 1}}.build(t)
	a := NewAdmission(cfg, 1)
	for _, n := range []string{"web", "web", "api", "api", "misc", "misc"} {
		var tk Ticket
		a.Admit(cfg.ServiceByName(n), &tk)
	}
	if ev := drain(a); len(ev) != 1 || ev[0].Name != "web" {
		t.Errorf("events %v, want web's alone", ev)
	}
	if d := a.DroppedEvents(); d != 2 {
		t.Errorf("dropped %d, want 2", d)
	}
}

// TestBurstGuard shows the seed's hole (an idle window lets a client use many
// times the limit) and the token bucket closing it.
func TestBurstGuard(t *testing.T) {
	for _, tt := range []struct {
		name  string
		burst int64
	}{{"window only: the spike is admitted", 0}, {"burst guard: refused", 5000}} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := limitsCfg{web: Limits{MaxBandwidth: 1000, EnforceBandwidth: true, BurstBytes: tt.burst}}.build(t)
			a := NewAdmission(cfg, 0)
			src := &testBytes{}
			web := cfg.ServiceByName("web")
			t0 := time.Unix(0, 0)
			for at := time.Duration(0); at < 29*time.Second; at += 100 * time.Millisecond {
				a.Recompute(t0.Add(at), src) // idle
			}
			var conn Ticket
			if r, ok := a.Admit(web, &conn); !ok {
				t.Fatal(r)
			}
			src.add("web", 20000) // 20 times the limit in 100 ms; the window reads 666 B/s
			a.Recompute(t0.Add(29*time.Second), src)
			if s := stat(t, a, LevelVirtualServer, "web"); s.Bandwidth != 666 {
				t.Fatalf("window %d B/s, want 666", s.Bandwidth)
			}
			var tk Ticket
			r, ok := a.Admit(web, &tk)
			if tt.burst == 0 {
				if !ok {
					t.Fatalf("refused without a burst guard: %v", r)
				}
				return
			}
			want := Refusal{Over: Over{Level: LevelVirtualServer, Name: "web", Limit: LimitBurst, Value: 5000, Measured: -5000}}
			if ok || r != want {
				t.Fatalf("ok=%v %v, want %v", ok, r, want)
			}
			if got, w := r.Error(), `virtual server "web": burst 5000 B exhausted (bucket -5000 B)`; got != w {
				t.Errorf("text %q, want %q", got, w)
			}
			// The debt (bounded at one burst) is repaid at 1000 B/s: still
			// empty at 34 s, admitting again after 5 s.
			for at := 29*time.Second + 100*time.Millisecond; at <= 34*time.Second; at += 100 * time.Millisecond {
				a.Recompute(t0.Add(at), src)
			}
			if _, ok := a.Admit(web, &tk); ok {
				t.Fatalf("admitted with bucket %d", stat(t, a, LevelVirtualServer, "web").BurstTokens)
			}
			a.Recompute(t0.Add(34*time.Second+100*time.Millisecond), src)
			if r, ok := a.Admit(web, &tk); !ok {
				t.Fatalf("still refused after the debt was repaid: %v", r)
			}
			if s := stat(t, a, LevelVirtualServer, "web"); s.BurstTokens != 100 {
				t.Errorf("bucket %d B, want 100", s.BurstTokens)
			}
		})
	}
}

func TestBurstRefillExact(t *testing.T) {
	// 166 B/s refilled every 100 ms is 16.6 B a step: the remainder carries.
	cfg := limitsCfg{inst: Limits{MaxBandwidth: 166, BurstBytes: 1 << 20}}.build(t)
	a := NewAdmission(cfg, 0)
	src := &testBytes{}
	t0 := time.Unix(0, 0)
	a.Recompute(t0, src)
	src.add("misc", 1<<20)                         // misc is in no class: its bytes reach the instance directly
	a.Recompute(t0.Add(100*time.Millisecond), src) // 16 refilled (16.6), then drained
	base := stat(t, a, LevelInstance, "weir").BurstTokens
	for at := 200 * time.Millisecond; at <= 10100*time.Millisecond; at += 100 * time.Millisecond {
		a.Recompute(t0.Add(at), src)
	}
	if got := stat(t, a, LevelInstance, "weir").BurstTokens - base; got != 1660 {
		t.Errorf("10 s of refill at 166 B/s: %d B, want 1660", got)
	}
}
