package main

import (
	"fmt"
	"strconv"
	"sync"

	"weir/datapath"
	"weir/datapath/pcapdev"
	"weir/policy/config"
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

// byteSize is a pflag.Value for a byte count in the config file's syntax
// (config.ParseBytes): B, kB or KB (1000), MB, GB, KiB (1024), MiB, GiB.
type byteSize struct{ n *int64 }

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
	v, err := config.ParseBytes(s)
	if err != nil {
		return err
	}
	*b.n = v
	return nil
}

func (b byteSize) Type() string { return "bytes" }
