//go:build !linux

package hostcap

import (
	"errors"
	"net/netip"
	"time"

	"weir/datapath"
)

// Capture is a host-leg capture; only Linux has one.
type Capture struct{}

// Open fails: AF_PACKET is Linux's.
func Open(Options) (*Capture, error) {
	return nil, errors.New("hostcap: a host-leg capture needs Linux (AF_PACKET)")
}

// SetTargets does nothing.
func (c *Capture) SetTargets([]netip.AddrPort) error { return ErrClosed }

// Segments returns nil.
func (c *Capture) Segments(local, remote netip.AddrPort) *datapath.SegStats { return nil }

// Release does nothing.
func (c *Capture) Release(local, remote netip.AddrPort) {}

// Stats returns zeros.
func (c *Capture) Stats() Stats { return Stats{} }

// Err returns ErrClosed.
func (c *Capture) Err() error { return ErrClosed }

// Sync returns false.
func (c *Capture) Sync(time.Duration) bool { return false }

// Close does nothing.
func (c *Capture) Close() error { return nil }
