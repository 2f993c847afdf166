package main

import (
	"encoding/json"
	"errors"
	"net"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"weir/cmd/weir/api"
	"weir/cmd/weir/internal/admin"
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
	if err := runStatus(&out, addr, "tok", false); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"weir edge1 — config generation 2", "3 open connections", "t1", "instance draining: 1"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("weir status lacks %q:\n%s", want, out.String())
		}
	}

	out.Reset()
	if err := runStatus(&out, addr, "tok", true); err != nil {
		t.Fatal(err)
	}
	var got api.Status
	if err := json.Unmarshal([]byte(out.String()), &got); err != nil || got.Instance != "edge1" || got.Services[0].Targets[0].Picked != 9 {
		t.Errorf("weir status --json: %v %+v", err, got)
	}

	if err := runStatus(&out, addr, "", false); err == nil || !strings.Contains(err.Error(), "401") {
		t.Errorf("without the token: %v, want a 401", err)
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	if err := runStatus(&out, dead, "", false); err == nil || !strings.Contains(err.Error(), "no weir answering at "+dead) {
		t.Errorf("nothing listening: %v", err)
	}
}
