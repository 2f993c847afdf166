package datapath

import (
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"
	"unsafe"
)

func testKey(i int) FlowKey {
	k := FlowKey{ServerPort: 80, ClientPort: uint16(i), Proto: ProtoTCP}
	k.Server = [16]byte{10: 0xff, 11: 0xff, 12: 198, 13: 18, 15: 1}
	k.Client = [16]byte{10: 0xff, 11: 0xff, 12: 198, 13: 19, 14: byte(i >> 8), 15: byte(i)}
	return k
}

func TestFlowTableInsertLookup(t *testing.T) {
	ft := NewFlowTable(FlowTableOptions{MaxFlows: 1000, Shards: 4})
	for i := range 500 {
		k := testKey(i)
		if ft.Insert(&Flow{Key: k, TOS: uint8(i)}, k.Hash(), 0) == nil {
			t.Fatalf("insert %d refused", i)
		}
	}
	for i := range 500 {
		k := testKey(i)
		f := ft.Lookup(&k, k.Hash(), 1)
		if f == nil || f.Key != k || f.TOS != uint8(i) {
			t.Fatalf("lookup %d = %+v", i, f)
		}
		if f.Target() != NoTarget {
			t.Fatalf("new flow target = %d, want NoTarget", f.Target())
		}
	}
	k := testKey(600)
	if f := ft.Lookup(&k, k.Hash(), 1); f != nil {
		t.Fatalf("lookup of absent key = %+v", f)
	}
	// Replacing keeps one flow per key.
	k = testKey(7)
	ft.Insert(&Flow{Key: k, TOS: 0xee}, k.Hash(), 2)
	if f := ft.Lookup(&k, k.Hash(), 2); f.TOS != 0xee {
		t.Fatalf("after replace TOS = %#x", f.TOS)
	}
	st := ft.Stats()
	if st.Flows != 500 || st.Inserted != 500 || st.Replaced != 1 {
		t.Fatalf("stats = %+v", st)
	}
}

func TestFlowTableIdleExpiry(t *testing.T) {
	idle := time.Minute
	ft := NewFlowTable(FlowTableOptions{MaxFlows: 64, IdleTimeout: idle, Shards: 1})
	sec := int64(time.Second)
	a, b := testKey(1), testKey(2)
	ft.Insert(&Flow{Key: a}, a.Hash(), 0)
	ft.Insert(&Flow{Key: b}, b.Hash(), 0)
	tests := []struct {
		name string
		now  int64
		key  FlowKey
		want bool
	}{
		{"a fresh", 10 * sec, a, true},
		{"b at the limit", 60 * sec, b, true},
		{"a within", 65 * sec, a, true},
		{"b just past", 121 * sec, b, false},
		{"a kept alive by lookups", 125 * sec, a, true},
		{"a idle past its last lookup", 186 * sec, a, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := ft.Lookup(&tt.key, tt.key.Hash(), tt.now) != nil; got != tt.want {
				t.Errorf("present = %v, want %v", got, tt.want)
			}
		})
	}
	if n := ft.Expire(200 * sec); n != 2 {
		t.Errorf("Expire removed %d, want 2", n)
	}
	if st := ft.Stats(); st.Flows != 0 || st.Expired != 2 {
		t.Errorf("stats after expiry = %+v", st)
	}
}

func TestFlowTableExpireStepCoversAllShards(t *testing.T) {
	ft := NewFlowTable(FlowTableOptions{MaxFlows: 1024, IdleTimeout: time.Second, Shards: 8})
	for i := range 100 {
		k := testKey(i)
		ft.Insert(&Flow{Key: k}, k.Hash(), 0)
	}
	later := int64(2 * time.Second)
	n := 0
	for range ft.Shards() - 1 {
		n += ft.ExpireStep(later)
	}
	if n == 100 {
		t.Fatal("fewer steps than shards removed every flow: steps sweep more than one shard")
	}
	n += ft.ExpireStep(later)
	if n != 100 || ft.Stats().Flows != 0 {
		t.Fatalf("one pass of steps removed %d of 100 idle flows", n)
	}
}

func TestFlowTableBound(t *testing.T) {
	sec := int64(time.Second)
	ft := NewFlowTable(FlowTableOptions{MaxFlows: 16, IdleTimeout: 10 * time.Second, Shards: 1})
	for i := range 16 {
		k := testKey(i)
		if ft.Insert(&Flow{Key: k}, k.Hash(), int64(i)*sec/2) == nil {
			t.Fatalf("insert %d refused below the bound", i)
		}
	}
	k := testKey(100)
	if ft.Insert(&Flow{Key: k}, k.Hash(), 8*sec) != nil {
		t.Fatal("insert past the bound with no idle flow accepted")
	}
	if st := ft.Stats(); st.Refused != 1 || st.Flows != 16 {
		t.Fatalf("stats = %+v, want 1 refused, 16 flows", st)
	}
	// At 11.25 s flows 0, 1 and 2 (seen at 0, 0.5 and 1 s) are idle over
	// 10 s: a full shard sweeps them and takes the new flow.
	if ft.Insert(&Flow{Key: k}, k.Hash(), 11*sec+sec/4) == nil {
		t.Fatal("insert refused although idle flows could be expired")
	}
	st := ft.Stats()
	if st.Flows != 14 || st.Expired != 3 {
		t.Fatalf("stats = %+v, want 14 flows, 3 expired", st)
	}
	for i := 3; i < 16; i++ {
		k := testKey(i)
		if ft.Lookup(&k, k.Hash(), 11*sec+sec/4) == nil {
			t.Fatalf("live flow %d lost by the sweep", i)
		}
	}
}

// TestFlowTableChurn inserts and expires many generations so that shards
// rebuild, while readers look flows up concurrently: a reader may miss a
// flow being inserted but must never get a flow with another key. Run it
// under -race.
func TestFlowTableChurn(t *testing.T) {
	ft := NewFlowTable(FlowTableOptions{MaxFlows: 256, IdleTimeout: time.Second, Shards: 2})
	sec := int64(time.Second)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for r := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				k := testKey((i*7 + r) % 2048)
				if f := ft.Lookup(&k, k.Hash(), 0); f != nil && f.Key != k {
					t.Errorf("lookup returned a flow with another key")
					return
				}
			}
		}()
	}
	for gen := range 20 {
		now := int64(gen) * 2 * sec
		for i := range 100 {
			k := testKey(gen*100 + i)
			if ft.Insert(&Flow{Key: k}, k.Hash(), now) == nil {
				t.Fatalf("gen %d: insert %d refused", gen, i)
			}
		}
		for i := range 100 {
			k := testKey(gen*100 + i)
			if ft.Lookup(&k, k.Hash(), now) == nil {
				t.Fatalf("gen %d: flow %d missing", gen, i)
			}
		}
		ft.Expire(now + 2*sec)
	}
	close(stop)
	wg.Wait()
	if st := ft.Stats(); st.Flows != 0 || st.Inserted != 2000 || st.Expired != 2000 {
		t.Fatalf("stats = %+v", st)
	}
}

func TestFlowTableLookupZeroAllocs(t *testing.T) {
	ft := NewFlowTable(FlowTableOptions{})
	k := testKey(1)
	h := k.Hash()
	ft.Insert(&Flow{Key: k}, h, 0)
	now := int64(0)
	allocs := testing.AllocsPerRun(1000, func() {
		now += int64(time.Millisecond)
		if ft.Lookup(&k, k.Hash(), now) == nil {
			t.Fatal("miss")
		}
	})
	if allocs != 0 {
		t.Errorf("Lookup allocates %.1f times, want 0", allocs)
	}
}

func BenchmarkFlowLookup(b *testing.B) {
	ft := NewFlowTable(FlowTableOptions{})
	keys := make([]FlowKey, 4096)
	for i := range keys {
		keys[i] = testKey(i)
		ft.Insert(&Flow{Key: keys[i]}, keys[i].Hash(), 0)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		k := &keys[i&4095]
		if ft.Lookup(k, k.Hash(), 1) == nil {
			b.Fatal("miss")
		}
	}
}

// TestFlowLayout pins what the Flow's field order is for: the fields a
// lookup reads lie in its first 64 bytes, and the size keeps heap Flows
// aligned on a cache line.
func TestFlowLayout(t *testing.T) {
	var f Flow
	if s := unsafe.Sizeof(f); s != 128 {
		t.Errorf("Flow is %d bytes, want 128 (a size class aligned to 128)", s)
	}
	for name, end := range map[string]uintptr{
		"tag":      unsafe.Offsetof(f.tag) + unsafe.Sizeof(f.tag),
		"Key":      unsafe.Offsetof(f.Key) + unsafe.Sizeof(f.Key),
		"SetTOS":   unsafe.Offsetof(f.SetTOS) + unsafe.Sizeof(f.SetTOS),
		"Row":      unsafe.Offsetof(f.Row) + unsafe.Sizeof(f.Row),
		"target":   unsafe.Offsetof(f.target) + unsafe.Sizeof(f.target),
		"Gen":      unsafe.Offsetof(f.Gen) + unsafe.Sizeof(f.Gen),
		"lastSeen": unsafe.Offsetof(f.lastSeen) + unsafe.Sizeof(f.lastSeen),
	} {
		if end > 64 {
			t.Errorf("Flow.%s ends at byte %d, past the first cache line", name, end)
		}
	}
}

// TestFlowHashStable pins FlowKey.Hash: it is weir's one flow hash, and
// Maglev maps it to a target on every instance, so instances behind ECMP (or
// one instance across a restart or an upgrade) must agree on it. A change
// here moves flows between targets: do it on purpose or not at all. The key
// of a flow is the same from NewFlowKey, from its client's packets and from
// the replies.
func TestFlowHashStable(t *testing.T) {
	for _, tc := range []struct {
		client, server string
		want           uint64
	}{
		{"198.18.0.2:40000", "198.19.0.80:80", 0x20f7b0d2fedbcbe3},
		{"[fd00::2]:40000", "[fd00::80]:443", 0x5c8a491c504ff09b},
		{"10.0.0.1:1", "10.0.0.2:2", 0x4558f19d6adad89b},
	} {
		c, s := netip.MustParseAddrPort(tc.client), netip.MustParseAddrPort(tc.server)
		k := NewFlowKey(c, s, ProtoTCP)
		if got := k.Hash(); got != tc.want {
			t.Errorf("%s → %s: hash %#x, want %#x", c, s, got, tc.want)
		}
		if k.ClientAddrPort() != c || k.ServerAddrPort() != s {
			t.Errorf("key round trip: %v %v", k.ClientAddrPort(), k.ServerAddrPort())
		}
		// An IPv4 address given IPv4-mapped is the same flow.
		if c.Addr().Is4() {
			m := NewFlowKey(netip.AddrPortFrom(netip.AddrFrom16(c.Addr().As16()), c.Port()), s, ProtoTCP)
			if m != k {
				t.Errorf("IPv4-mapped client gives another key")
			}
		}
	}
	// Packets of the flow, both ways, carry the same key.
	in := tcp4(t, net.IPv4(198, 18, 0, 2), net.IPv4(198, 19, 0, 80), 40000, 80, 0, true, false, 0)
	out := tcp4(t, net.IPv4(198, 19, 0, 80), net.IPv4(198, 18, 0, 2), 80, 40000, 0, true, true, 0)
	var p Packet
	var k FlowKey
	want := NewFlowKey(netip.MustParseAddrPort("198.18.0.2:40000"), netip.MustParseAddrPort("198.19.0.80:80"), ProtoTCP)
	if Parse(in, &p) != DropNone {
		t.Fatal("ingress packet dropped")
	}
	if p.ingressKeyInto(&k); k != want {
		t.Errorf("ingress key %+v, want %+v", k, want)
	}
	if Parse(out, &p) != DropNone {
		t.Fatal("egress packet dropped")
	}
	k = FlowKey{}
	if p.egressKeyInto(&k); k != want {
		t.Errorf("egress key %+v, want %+v", k, want)
	}
}

// BenchmarkFloodInsert is a SYN flood's cost in the flow table: each op
// inserts a new half-open flow into a full table (the default 65 536) of
// half-open flows, all younger than the handshake timeout, so each insert
// must evict one. Before makeRoom every such insert scanned its whole
// shard for expired flows first.
func BenchmarkFloodInsert(b *testing.B) {
	const max = 65536
	ft := NewFlowTable(FlowTableOptions{MaxFlows: max})
	key := func(i int) FlowKey {
		k := testKey(i)
		k.Client[13] = byte(i >> 16)
		k.ClientPort = uint16(i * 7)
		return k
	}
	flows := make([]Flow, max+b.N)
	now := int64(time.Second)
	for i := range flows {
		flows[i].Key = key(i)
		flows[i].half.Store(true)
	}
	for i := range max {
		ft.Insert(&flows[i], flows[i].Key.Hash(), now)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		f := &flows[max+i]
		if ft.Insert(f, f.Key.Hash(), now+int64(i)) == nil {
			b.Fatal("refused: a full table of half-open flows must evict")
		}
	}
	b.StopTimer()
	if st := ft.Stats(); st.Refused != 0 {
		b.Fatalf("%+v", st)
	}
}
