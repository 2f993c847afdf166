package netstack

// TIME_WAIT reopen
//
// When a target closes first, weir sends the client leg's FIN first and that
// leg waits in TIME_WAIT. A busy client soon reuses the 4-tuple. gVisor
// hands a new SYN that hits a TIME_WAIT endpoint to a *listening* endpoint on
// the same address and port (RFC 1122's "MAY accept a new SYN"), but weir
// has no listener, only a forwarder, so gVisor drops the SYN, and every
// retry of it, until TIME_WAIT ends: the client stalls for its SYN timeouts
// (1 s, 3 s, …) and connections per second collapse.
//
// weir does what Linux does for an acceptable SYN: the TIME_WAIT connection
// gives way. The link's reader shows every pure SYN's 4-tuple (parsed by
// datapath.Parse, see synKey) to onSYN before the stack
// sees it; if its 4-tuple belongs to a client leg weir closed and that leg is
// in TIME_WAIT, the leg is aborted (freeing the 4-tuple; the RST it emits
// carries the old connection's numbers, which the client's new SYN_SENT
// ignores as unacceptable) and the SYN then reaches the forwarder as a new
// connection. Linux also reopens on an old-sequence SYN after one round of
// ACK and RST; weir skips that round: the 4-tuple's old connection is over
// on both sides (the client sent its FIN and weir acknowledged it).

import (
	"net/netip"
	"sync"
	"sync/atomic"

	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/waiter"
)

// twKey is a 4-tuple as weir's side sees it.
type twKey struct {
	local, remote netip.AddrPort
}

// timeWaitTable holds the client legs weir closed first, until they leave
// TIME_WAIT.
type timeWaitTable struct {
	mu       sync.Mutex
	m        map[twKey]*Conn // protected by mu
	reopened atomic.Uint64
}

func (t *timeWaitTable) init() { t.m = make(map[twKey]*Conn) }

func keyOf(id stack.TransportEndpointID) twKey {
	return twKey{
		local:  netip.AddrPortFrom(netipAddr(id.LocalAddress), id.LocalPort),
		remote: netip.AddrPortFrom(netipAddr(id.RemoteAddress), id.RemotePort),
	}
}

// track records c if weir closed it first (it is in FIN_WAIT or TIME_WAIT
// now) and removes it again once it is closed.
func (t *timeWaitTable) track(c *Conn) {
	switch c.state() {
	case tcp.StateFinWait1, tcp.StateFinWait2, tcp.StateClosing, tcp.StateTimeWait:
	default:
		return
	}
	k := keyOf(c.ep.Info().(*stack.TransportEndpointInfo).ID)
	t.mu.Lock()
	t.m[k] = c
	t.mu.Unlock()
	// The stack notifies EventHUp when TIME_WAIT ends. The callback runs in
	// the notifier's context and must not touch the waiter queue.
	entry := waiter.NewFunctionEntry(waiter.EventHUp, func(waiter.EventMask) {
		switch c.state() {
		case tcp.StateClose, tcp.StateError:
			t.mu.Lock()
			if t.m[k] == c {
				delete(t.m, k)
			}
			t.mu.Unlock()
		}
	})
	c.wq.EventRegister(&entry)
	// It may have closed before the entry was registered.
	switch c.state() {
	case tcp.StateClose, tcp.StateError:
		t.mu.Lock()
		if t.m[k] == c {
			delete(t.m, k)
		}
		t.mu.Unlock()
	}
}

// onSYN runs in a link's reader goroutine for every pure SYN, with its
// 4-tuple k.
func (t *timeWaitTable) onSYN(k twKey) {
	t.mu.Lock()
	c := t.m[k]
	if c == nil {
		t.mu.Unlock()
		return
	}
	if s := c.state(); s != tcp.StateTimeWait {
		if s == tcp.StateClose || s == tcp.StateError {
			delete(t.m, k)
		}
		t.mu.Unlock()
		return
	}
	delete(t.m, k)
	t.mu.Unlock()
	// Abort notifies the waiter queue, whose callback takes t.mu: call it
	// unlocked.
	c.ep.Abort()
	t.reopened.Add(1)
}
