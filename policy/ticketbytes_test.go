package policy

import (
	"net/netip"
	"testing"
)

// TestTicketAddBytes: an http request's bytes, counted through its ticket,
// reach every level of its chain at once (the virtual server, its class,
// the instance), follow the ticket across a reload that moves the virtual
// server to another class, and stop at Release.
func TestTicketAddBytes(t *testing.T) {
	a0, b0 := &Class{Name: "a"}, &Class{Name: "b"}
	vs := &VirtualServer{Name: "web", VIPs: []netip.Addr{netip.MustParseAddr("198.19.0.80")}, Ports: PortRange{Lo: 80, Hi: 80}, Class: a0,
		Targets: []*Target{{Name: "t1", Addr: netip.MustParseAddrPort("198.19.1.10:8080"), Weight: 1}}}
	cfg, err := Compile(&Config{Classes: []*Class{a0, b0}, Services: []*VirtualServer{vs}})
	if err != nil {
		t.Fatal(err)
	}
	adm := NewAdmission(cfg, 0)
	bytesAt := func(kind LevelKind, name string) uint64 {
		for _, l := range adm.Snapshot() {
			if l.Level == kind && (kind == LevelInstance || l.Name == name) {
				return l.Bytes
			}
		}
		t.Fatalf("no level %v %s", kind, name)
		return 0
	}
	var tk Ticket
	if _, ok := adm.Admit(cfg.Services[0], &tk); !ok {
		t.Fatal("refused")
	}
	tk.AddBytes(100)
	if v, c, i := bytesAt(LevelVirtualServer, "web"), bytesAt(LevelClass, "a"), bytesAt(LevelInstance, ""); v != 100 || c != 100 || i != 100 {
		t.Fatalf("after 100 bytes: web %d, class a %d, instance %d; want 100 each", v, c, i)
	}

	// Reload: web moves to class b; the open request's bytes follow it.
	a1, b1 := &Class{Name: "a"}, &Class{Name: "b"}
	vs1 := *vs
	vs1.Class = b1
	cfg1, err := Compile(&Config{Classes: []*Class{a1, b1}, Services: []*VirtualServer{&vs1}})
	if err != nil {
		t.Fatal(err)
	}
	adm.Apply(cfg1)
	tk.AddBytes(50)
	if v, a, b := bytesAt(LevelVirtualServer, "web"), bytesAt(LevelClass, "a"), bytesAt(LevelClass, "b"); v != 150 || a != 100 || b != 50 {
		t.Errorf("after the reload and 50 bytes: web %d, class a %d, class b %d; want 150, 100, 50", v, a, b)
	}
	tk.Release()
	tk.AddBytes(1000)
	if v := bytesAt(LevelVirtualServer, "web"); v != 150 {
		t.Errorf("bytes after Release counted: web %d, want 150", v)
	}
}
