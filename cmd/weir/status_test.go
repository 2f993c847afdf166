package main

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"weir/cmd/weir/api"
	"weir/cmd/weir/internal/admin"
	"weir/internal/testutil"
)

type statusSource struct{ st api.Status }

func (s statusSource) Status() api.Status            { return s.st }
func (s statusSource) Connections() []api.Connection { return nil }
func (s statusSource) Healthy() error                { return errors.New("not asked") }

// TestStatusCommand runs `weir status` against an admin API: the tables,
// --json, the token, and the errors a user sees.
func TestStatusCommand(t *testing.T) {
	st := api.Status{
		Instance: "edge1", Generation: 2, Open: 3,
		Services: []api.Service{{Name: "web", Proto: "http", Ports: "80", Balancer: "wrr",
			Targets: []api.Target{{Name: "t1", Role: "primary", Weight: 4, Effective: 2, HealthUp: true, Picked: 9}}}},
		Refusals: []api.Refusal{{Level: "instance", Limit: "draining", Count: 1}},
	}
	srv := httptest.NewServer(admin.Handler(admin.Options{Token: "tok"}, statusSource{st}, prometheus.NewRegistry()))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")

	var out strings.Builder
	if err := runStatus(&out, http.DefaultClient, addr, "tok", false); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"weir edge1 — config generation 2", "3 open connections", "t1", "instance draining: 1"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("weir status lacks %q:\n%s", want, out.String())
		}
	}

	out.Reset()
	if err := runStatus(&out, http.DefaultClient, addr, "tok", true); err != nil {
		t.Fatal(err)
	}
	var got api.Status
	if err := json.Unmarshal([]byte(out.String()), &got); err != nil || got.Instance != "edge1" || got.Services[0].Targets[0].Picked != 9 {
		t.Errorf("weir status --json: %v %+v", err, got)
	}

	if err := runStatus(&out, http.DefaultClient, addr, "", false); err == nil || !strings.Contains(err.Error(), "401") {
		t.Errorf("without the token: %v, want a 401", err)
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	if err := runStatus(&out, http.DefaultClient, dead, "", false); err == nil || !strings.Contains(err.Error(), "no weir answering at "+dead) {
		t.Errorf("nothing listening: %v", err)
	}
}

// seqSource serves a status whose carol loses weight from the second ask on.
type seqSource struct{ n *atomic.Int64 }

func (s seqSource) Status() api.Status {
	eff := 4
	if s.n.Add(1) > 1 {
		eff = 2
	}
	return api.Status{Instance: "edge1", Generation: 1, Services: []api.Service{{Name: "shop",
		Targets: []api.Target{{Name: "carol", Role: "primary", Weight: 4, Effective: eff, HealthUp: true}}}}}
}
func (s seqSource) Connections() []api.Connection { return nil }
func (s seqSource) Healthy() error                { return nil }

// TestStatusWatch: --watch redraws (clearing the screen) and names what
// changed since the previous refresh; plain `weir status` names what changed
// in the last sampling interval from /history.
func TestStatusWatch(t *testing.T) {
	hist := func() api.History {
		return api.History{Targets: []api.TargetSeries{{Service: "shop", Target: "carol", At: []int64{1000, 2000}, Weight: []int{4, 4}, Effective: []int{4, 1}}}}
	}
	asked := new(atomic.Int64)
	srv := httptest.NewServer(admin.Handler(admin.Options{History: hist}, seqSource{asked}, prometheus.NewRegistry()))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")

	var once strings.Builder
	if err := runStatus(&once, http.DefaultClient, addr, "", false); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(once.String(), "changed since the previous sample:\n  shop/carol: effective weight 4 → 1 of 4") {
		t.Errorf("weir status does not name the change:\n%s", once.String())
	}

	asked.Store(0) // the first frame sees weight 4, the next ones 2
	out := &testutil.SyncBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- watchStatus(ctx, out, http.DefaultClient, addr, "", 20*time.Millisecond) }()
	testutil.Eventually(t, 5*time.Second, func() bool { return strings.Count(out.String(), "\033[H\033[2J") >= 3 }, "three frames")
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	s := out.String()
	for _, want := range []string{"weir status --watch: every 20ms", "shop/carol: effective weight 4 → 2 of 4", "  nothing"} {
		if !strings.Contains(s, want) {
			t.Errorf("watch output lacks %q:\n%s", want, s)
		}
	}
}
