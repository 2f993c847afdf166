package netstack

import (
	"bufio"
	"encoding/hex"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"weir/datapath"
	"weir/internal/testutil"
	"weir/policy"
)

// TestMalformedCorpus sends each packet file of testdata/malformed through
// the whole ingress path, datapath engine and stack, and checks that the
// counter its "# want:" line names moved: "datapath:REASON" is
// EngineStats.Dropped under that DropReason, "stack:FIELD" a StackStats
// field. Nothing panics, and a real connection is served afterwards.
func TestMalformedCorpus(t *testing.T) {
	files, err := filepath.Glob("testdata/malformed/*.hex")
	if err != nil || len(files) == 0 {
		t.Fatalf("no corpus: %v", err)
	}
	taddr, stop := echoServer(t, "tcp4", "127.0.0.1:0")
	defer stop()
	vs := &policy.VirtualServer{Name: "echo", VIPs: []netip.Addr{vipV4, vipV6}, Ports: policy.PortRange{Lo: 80, Hi: 80},
		Targets: []*policy.Target{{Name: "t", Addr: taddr, Weight: 1}}}
	cfg, err := policy.Compile(&policy.Config{Services: []*policy.VirtualServer{vs}})
	if err != nil {
		t.Fatal(err)
	}
	var eng *datapath.Engine
	adm := &testAdmitter{target: vs.Targets[0]}
	r := newRig(t, rigOptions{
		fwd:    fwdOptions{Services: cfg.TCPService, Admitter: adm},
		listen: cfg.Services,
		wrapFront: func(d datapath.Device) datapath.Device {
			eng = datapath.NewEngine(d, cfg, datapath.EngineOptions{})
			return eng
		},
	})
	counter := func(want string) uint64 {
		kind, name, _ := strings.Cut(want, ":")
		switch kind {
		case "datapath":
			st := eng.Stats()
			for i := range st.Dropped {
				if datapath.DropReason(i).String() == name {
					return st.Dropped[i]
				}
			}
		case "stack":
			if f := reflect.ValueOf(r.weir.Stats()).FieldByName(name); f.IsValid() {
				return f.Uint()
			}
		}
		t.Fatalf("unknown counter %q", want)
		return 0
	}
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".hex"), func(t *testing.T) {
			want, pkts := readCorpusFile(t, f)
			before := counter(want)
			if _, err := r.clientDev.Write(pkts, 0); err != nil {
				t.Fatal(err)
			}
			if !testutil.Within(5*time.Second, func() bool { return counter(want) > before }) {
				t.Errorf("%s did not move (still %d); datapath %+v, stack %+v", want, before, eng.Stats().Dropped, r.weir.Stats())
			}
		})
	}
	c := dial(t, r.client, netip.AddrPortFrom(vipV4, 80))
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte("ok")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Read(make([]byte, 2)); err != nil {
		t.Fatalf("after the corpus: %v", err)
	}
}

// readCorpusFile reads a corpus file: "# want: COUNTER" among its comment
// lines, then one packet in hex per line.
func readCorpusFile(t *testing.T, path string) (want string, pkts [][]byte) {
	t.Helper()
	fh, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	sc := bufio.NewScanner(fh)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if w, ok := strings.CutPrefix(line, "# want:"); ok {
			want = strings.TrimSpace(w)
			continue
		}
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		b, err := hex.DecodeString(line)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		pkts = append(pkts, b)
	}
	if want == "" || len(pkts) == 0 {
		t.Fatalf("%s: no want line or no packet", path)
	}
	return want, pkts
}
