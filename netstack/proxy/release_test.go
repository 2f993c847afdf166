package proxy

import (
	"net/netip"
	"sync/atomic"
	"testing"
)

// releaseSession counts Released and checks it comes at most once.
type releaseSession struct {
	released atomic.Int32
}

func (s *releaseSession) DialFailed(Decision, error) Decision { return Decision{Verdict: RefuseRST} }
func (s *releaseSession) TargetFailed(Decision, error)        {}
func (*releaseSession) Spliced(int64)                         {}
func (s *releaseSession) Released()                           { s.released.Add(1) }
func (s *releaseSession) End(*End)                            {}

// peerLeg is a client leg whose FIN has or has not arrived.
type peerLeg struct{ closed atomic.Bool }

func (l *peerLeg) PeerClosed() bool { return l.closed.Load() }

// TestReleaseOnBothCloses: the second of the two client-side closes
// releases the connection once, whichever comes first; Settle reports a
// release since its generation, and a connection with weir's FIN sent and
// the client's in the leg's state is released by Settle (and PreSettle)
// before the copy half has seen that FIN.
func TestReleaseOnBothCloses(t *testing.T) {
	ip := netip.MustParseAddr("198.18.0.2")
	var set ClosingSet

	// Both closes through ClientDone, the client's first.
	s1, l1 := &releaseSession{}, &peerLeg{}
	r1 := set.Track(ip, l1, s1)
	since := set.Gen()
	r1.ClientDone(ClientRcvClosed)
	if s1.released.Load() != 0 {
		t.Fatal("released after one close")
	}
	r1.ClientDone(ClientSndClosed)
	r1.Release() // End's call: no second Released
	if n := s1.released.Load(); n != 1 {
		t.Fatalf("Released %d times, want 1", n)
	}
	if !set.Settle(ip, 0, since) {
		t.Error("Settle does not report the release since its generation")
	}

	// weir's FIN sent, the client's only in the leg's state: Settle
	// releases it; a connection still open is left alone.
	s2, l2 := &releaseSession{}, &peerLeg{}
	s3, l3 := &releaseSession{}, &peerLeg{}
	r2 := set.Track(ip, l2, s2)
	set.Track(ip, l3, s3)
	since = set.Gen()
	r2.ClientDone(ClientSndClosed)
	if set.Settle(ip, 0, since) {
		t.Fatal("Settle released a connection whose client FIN has not arrived")
	}
	l2.closed.Store(true)
	if !set.Settle(ip, 0, since) || s2.released.Load() != 1 || s3.released.Load() != 0 {
		t.Fatalf("Settle: released %d and %d, want 1 and 0", s2.released.Load(), s3.released.Load())
	}

	// PreSettle does the same before an admission.
	s4, l4 := &releaseSession{}, &peerLeg{}
	r4 := set.Track(ip, l4, s4)
	r4.ClientDone(ClientSndClosed)
	l4.closed.Store(true)
	set.PreSettle(ip)
	if s4.released.Load() != 1 {
		t.Fatal("PreSettle did not release a finished connection")
	}
	// Another client's connections are not touched.
	other := netip.MustParseAddr("198.18.0.3")
	if set.Settle(other, 0, set.Gen()) {
		t.Error("Settle of another client reports a release")
	}

	// A nil Release (an http target connection's) does nothing.
	var none *Release
	none.ClientDone(ClientRcvClosed | ClientSndClosed)
	none.Release()
}
