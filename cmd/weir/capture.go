package main

import (
	"fmt"
	"strconv"
	"strings"
	"sync"

	"weir/datapath"
	"weir/datapath/pcapdev"
)

// defaultCaptureMax bounds a --capture file when --capture-max is not
// given: big enough for a few minutes of a debugging session, small enough
// that a forgotten flag cannot fill a disk.
const defaultCaptureMax = 64 << 20

// frontCapture records what weir's front NIC sees, both directions, every
// TUN queue into one pcap file.
type frontCapture struct {
	c      *pcapdev.Capture
	fronts []datapath.Device // the TUN queues wrapped by recorders

	once  sync.Once
	final pcapdev.CaptureStats
}

// startCapture creates the capture at path, bounded to max bytes, and
// wraps every front queue in a recorder writing to it.
func startCapture(path string, max int64, fronts []datapath.Device) (*frontCapture, error) {
	c, err := pcapdev.CreateCapture(path, pcapdev.CaptureOptions{MaxBytes: max})
	if err != nil {
		return nil, fmt.Errorf("--capture: %w", err)
	}
	fc := &frontCapture{c: c}
	for _, d := range fronts {
		fc.fronts = append(fc.fronts, c.Wrap(d))
	}
	return fc, nil
}

// Close flushes and closes the capture once and returns what it holds.
func (fc *frontCapture) Close() pcapdev.CaptureStats {
	fc.once.Do(func() {
		fc.c.Close()
		fc.final = fc.c.Stats()
	})
	return fc.final
}

// byteSize is a pflag.Value for a byte count with an optional suffix:
// B, kB or KB (1000), MB, GB, KiB (1024), MiB, GiB — the units of the
// config file.
type byteSize struct{ n *int64 }

var byteUnits = []struct {
	suffix string
	mult   int64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30},
	{"kB", 1e3}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"B", 1},
}

func (b byteSize) String() string {
	if b.n == nil {
		return ""
	}
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if *b.n >= u.mult && *b.n%u.mult == 0 {
			return strconv.FormatInt(*b.n/u.mult, 10) + u.suffix
		}
	}
	return strconv.FormatInt(*b.n, 10)
}

func (b byteSize) Set(s string) error {
	num, mult := strings.TrimSpace(s), int64(1)
	for _, u := range byteUnits {
		if strings.HasSuffix(num, u.suffix) {
			num, mult = strings.TrimSpace(strings.TrimSuffix(num, u.suffix)), u.mult
			break
		}
	}
	v, err := strconv.ParseInt(num, 10, 64)
	if err != nil || v < 0 || v > (1<<62)/mult {
		return fmt.Errorf("want a byte count like 64MiB, 10MB or 1000000, got %q", s)
	}
	*b.n = v * mult
	return nil
}

func (b byteSize) Type() string { return "bytes" }
