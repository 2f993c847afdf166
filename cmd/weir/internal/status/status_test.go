package status

import (
	"reflect"
	"strings"
	"testing"

	"weir/balancer"
	"weir/cmd/weir/api"
	"weir/datapath"
	"weir/policy"
)

// rawNotInStatus are the raw counters the status document leaves out, each
// with the fact that already carries it (one fact, one number).
var rawNotInStatus = map[string]string{
	"Proxy.RefusedRST":          "Refusals: RST or 503 follows the service's protocol",
	"Proxy.Refused503":          "Refusals: RST or 503 follows the service's protocol",
	"Forwarder.DroppedInFlight": "Stack.SYNsDroppedInFlight (set from it in Parts)",
	"Stack.TCPForwardDropFull":  "a part of Stack.SYNsDroppedInFlight",
	"Forwarder.UDPUnreachable":  "Stack.UDPNoSocket, the same gVisor counter",
	"Proxy.DialFailed":          "Target.Failed and DialFailures",
	"UDPFront.Received":         "UDP.DatagramsIn with the new sessions' drops (Refused, DroppedFull, DroppedVIP) and NoService",
	"Proxy.Open":                "Open (admitted connections not yet closed)",
	"Forwarder.Panics":          "a part of Forwarder.Panics (the accept path's and the proxy's)",
	"Proxy.Panics":              "a part of Forwarder.Panics (the accept path's and the proxy's)",
	"Forwarder.Handshaking":     "a part of Forwarder.Pending (handshakes, then admission and dial)",
	"Proxy.Pending":             "a part of Forwarder.Pending (handshakes, then admission and dial)",
	"NICs.Device.RxPackets":     "NIC.RxPackets: the link counts the same packets",
	"NICs.Device.RxBytes":       "NIC.RxBytes",
	"NICs.Device.TxPackets":     "NIC.TxPackets",
	"NICs.Device.TxBytes":       "NIC.TxBytes",
}

// TestEveryRawCounterInStatus fails when a part gains a counter (a new
// drop reason, say) that the status document, and so /metrics, does not
// carry, unless rawNotInStatus says which fact already does.
func TestEveryRawCounterInStatus(t *testing.T) {
	raw := RawStats{NICs: []NICStats{{Name: "front", HasDevice: true}, {Name: "back0", Back: true, HasDevice: true}}}
	values := map[string][]float64{}
	next := 5000.0
	var fill func(path string, v reflect.Value)
	fill = func(path string, v reflect.Value) {
		switch v.Kind() {
		case reflect.Struct:
			for i := 0; i < v.NumField(); i++ {
				if f := v.Type().Field(i); f.IsExported() {
					fill(strings.TrimPrefix(path+"."+f.Name, "."), v.Field(i))
				}
			}
		case reflect.Slice, reflect.Array:
			for i := 0; i < v.Len(); i++ {
				fill(path, v.Index(i))
			}
		case reflect.Uint64, reflect.Int, reflect.Int64:
			next++
			if v.Kind() == reflect.Uint64 {
				v.SetUint(uint64(next))
			} else {
				v.SetInt(int64(next))
			}
			values[path] = append(values[path], next)
		}
	}
	fill("", reflect.ValueOf(&raw).Elem())
	doc := struct {
		D api.Datapath
		S api.Stack
		F api.Forwarder
		N []api.NIC
		C uint64
		U api.UDP
	}{}
	// Through Parts, as the appliance builds the document.
	var st api.Status
	Parts(&st, raw, nil)
	doc.D, doc.S, doc.F, doc.N, doc.C, doc.U = st.Datapath, st.Stack, st.Forwarder, st.NICs, st.Control.DroppedEvents, st.UDP
	// The sums of the accept path's and the proxy's parts.
	if want := raw.Forwarder.Panics + raw.Proxy.Panics; st.Forwarder.Panics != want {
		t.Errorf("Forwarder.Panics %d, want %d", st.Forwarder.Panics, want)
	}
	if want := raw.Forwarder.Handshaking + raw.Proxy.Pending; st.Forwarder.Pending != want {
		t.Errorf("Forwarder.Pending %d, want %d", st.Forwarder.Pending, want)
	}
	shown := map[float64]bool{}
	var collect func(v reflect.Value)
	collect = func(v reflect.Value) {
		switch v.Kind() {
		case reflect.Struct:
			for i := 0; i < v.NumField(); i++ {
				collect(v.Field(i))
			}
		case reflect.Slice:
			for i := 0; i < v.Len(); i++ {
				collect(v.Index(i))
			}
		case reflect.Pointer:
			if !v.IsNil() {
				collect(v.Elem())
			}
		case reflect.Uint64:
			shown[float64(v.Uint())] = true
		case reflect.Int, reflect.Int64:
			shown[float64(v.Int())] = true
		}
	}
	collect(reflect.ValueOf(doc))
	for path, vs := range values {
		if _, ok := rawNotInStatus[path]; ok {
			continue
		}
		for i, v := range vs {
			if path == "Datapath.Dropped" && i == int(datapath.DropNone) {
				continue // "none" is no drop
			}
			if !shown[v] {
				t.Errorf("raw counter %s (value %v) is not in the status document: add it to package api (and a metric) or to rawNotInStatus", path, v)
			}
		}
	}
}

// TestServices: every configured service is listed in file order, an http
// one with its clients, a service whose balancer a reload removed without
// targets, and each target with its explanation, action fractions and
// segments.
func TestServices(t *testing.T) {
	web := &policy.VirtualServer{Name: "web", Proto: policy.ProtoHTTP, HTTP: policy.HTTPOptions{MaxClients: 9}}
	gone := &policy.VirtualServer{Name: "gone"}
	cfg := &policy.Config{Services: []*policy.VirtualServer{web, gone}}
	k := policy.TargetKey{Service: "web", Target: "t1"}
	sm := Sampled{
		Explanations:    []policy.Explanation{{Service: "web", Target: "t1", Fraction: 40}},
		ActionFractions: map[string]map[string]map[string]int{"web": {"gold": {"t1": 25}}},
		Segments: func(got policy.TargetKey) (api.Segments, bool) {
			return api.Segments{Direction: "to_target"}, got == k
		},
	}
	snap := func(service string) (balancer.Status, bool) {
		if service != "web" {
			return balancer.Status{}, false
		}
		return balancer.Status{Refused: 3, Targets: []balancer.TargetStatus{{Name: "t1", Weight: 10, Levels: map[string]float64{"gold": 7}}}}, true
	}
	got := Services(cfg, sm, snap, func(service string) int64 { return int64(len(service)) })
	if len(got) != 2 || got[0].Name != "web" || got[1].Name != "gone" {
		t.Fatalf("services %+v, want web then gone", got)
	}
	w := got[0]
	if w.Clients != 3 || w.MaxClients != 9 || w.Refused != 3 || len(w.Targets) != 1 {
		t.Fatalf("web %+v: want 3 clients of 9, 3 refused, 1 target", w)
	}
	tg := w.Targets[0]
	if tg.Explanation == nil || tg.Explanation.Fraction != 40 || tg.Segments == nil || tg.Segments.Direction != "to_target" {
		t.Errorf("target %+v: want its explanation (fraction 40) and segments", tg)
	}
	if len(tg.Actions) != 1 || tg.Actions[0].Action != "gold" || tg.Actions[0].Fraction != 25 || tg.Actions[0].Exact != 7 {
		t.Errorf("actions %+v, want gold at fraction 25, exact 7", tg.Actions)
	}
	if g := got[1]; g.Clients != 0 || len(g.Targets) != 0 {
		t.Errorf("gone %+v: want no clients (tcp) and no targets", g)
	}
}
