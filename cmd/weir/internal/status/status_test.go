package status

import (
	"reflect"
	"strings"
	"testing"

	"weir/cmd/weir/api"
	"weir/datapath"
)

// rawNotInStatus are the raw counters the status document leaves out, each
// with the fact that already carries it (one fact, one number).
var rawNotInStatus = map[string]string{
	"Forwarder.RefusedRST":      "Refusals: RST or 503 follows the service's protocol",
	"Forwarder.Refused503":      "Refusals: RST or 503 follows the service's protocol",
	"Forwarder.DroppedInFlight": "Stack.SYNsDroppedInFlight (set from it in Parts)",
	"Stack.TCPForwardDropFull":  "a part of Stack.SYNsDroppedInFlight",
	"Forwarder.UDPUnreachable":  "Stack.UDPNoSocket, the same gVisor counter",
	"Forwarder.DialFailed":      "Target.Failed and DialFailures",
	"Forwarder.Open":            "Open (admitted connections not yet closed)",
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
	}{}
	// Through Parts, as the appliance builds the document.
	var st api.Status
	Parts(&st, raw, nil)
	doc.D, doc.S, doc.F, doc.N, doc.C = st.Datapath, st.Stack, st.Forwarder, st.NICs, st.Control.DroppedEvents
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
