package admit_test

import (
	"bytes"
	"encoding/json"
	"net/netip"
	"testing"

	"github.com/rs/zerolog"

	"weir/cmd/weir/internal/admit"
	"weir/netstack/proxy"
	"weir/policy"
)

// TestPanicLogLine: a panic the forwarder recovered is one error line with
// the value, the stack and the connection it happened in (none before the
// connection had an ID).
func TestPanicLogLine(t *testing.T) {
	var buf bytes.Buffer
	log := zerolog.New(&buf)
	a := admit.New(admit.Options{Log: &log})
	a.Panic(&proxy.ConnRequest{ID: 7, Client: netip.MustParseAddrPort("198.18.0.9:40000"), VIP: netip.MustParseAddrPort("198.19.0.80:80"),
		Service: &policy.VirtualServer{Name: "web"}}, "boom", []byte("goroutine 1 [running]"))
	a.Panic(&proxy.ConnRequest{}, 42, nil)
	dec := json.NewDecoder(&buf)
	var l struct {
		Level, Panic, Stack, Client, VIP, Service, Message string
		Conn                                               uint64
	}
	if err := dec.Decode(&l); err != nil {
		t.Fatal(err)
	}
	if l.Level != "error" || l.Panic != "boom" || l.Conn != 7 || l.Client != "198.18.0.9:40000" || l.VIP != "198.19.0.80:80" ||
		l.Service != "web" || l.Message != "panic in a connection; that connection was closed" {
		t.Errorf("line %+v", l)
	}
	if l.Stack == "" {
		t.Error("no stack")
	}
	l = struct {
		Level, Panic, Stack, Client, VIP, Service, Message string
		Conn                                               uint64
	}{}
	if err := dec.Decode(&l); err != nil {
		t.Fatal(err)
	}
	if l.Panic != "42" || l.Conn != 0 || l.Client != "" {
		t.Errorf("line without a connection: %+v", l)
	}
}
