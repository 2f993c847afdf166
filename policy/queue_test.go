package policy

import (
	"context"
	"net/netip"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// manualTimers is a Timer on a manual clock: a timer fires when the test
// advances the clock past its deadline.
type manualTimers struct {
	mu     sync.Mutex
	now    time.Time
	timers []*manualTimer
	armed  chan struct{} // one send per timer armed
}

type manualTimer struct {
	at      time.Time
	c       chan time.Time
	stopped bool
}

func newManualTimers() *manualTimers {
	return &manualTimers{now: time.Unix(1000, 0), armed: make(chan struct{}, 1024)}
}

func (m *manualTimers) Timer(d time.Duration) (<-chan time.Time, func() bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	t := &manualTimer{at: m.now.Add(d), c: make(chan time.Time, 1)}
	m.timers = append(m.timers, t)
	m.armed <- struct{}{}
	return t.c, func() bool {
		m.mu.Lock()
		defer m.mu.Unlock()
		was := !t.stopped
		t.stopped = true
		return was
	}
}

func (m *manualTimers) Now() time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.now
}

func (m *manualTimers) advance(d time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.now = m.now.Add(d)
	for _, t := range m.timers {
		if !t.stopped && !t.at.After(m.now) {
			t.stopped = true
			t.c <- m.now
		}
	}
}

// queueCfg is one virtual server "web" at maxConnections max with a queue.
func queueCfg(t testing.TB, max, queue int64, timeout time.Duration) (*Config, *VirtualServer) {
	t.Helper()
	vs := &VirtualServer{Name: "web", Ports: PortRange{80, 80}, VIPs: []netip.Addr{netip.MustParseAddr("10.0.0.1")},
		Limits: Limits{MaxConnections: max, EnforceConnections: true, Queue: queue, QueueTimeout: timeout}}
	c, err := Compile(&Config{Services: []*VirtualServer{vs}})
	if err != nil {
		t.Fatal(err)
	}
	return c, vs
}

type waitResult struct {
	i   int
	ref Refusal
	w   Waited
	ok  bool
}

// TestQueueFIFO: at maxConnections 2 with a queue of 3, three waiters
// are admitted in the order they came as slots free, a new arrival that
// finds a slot free while others wait joins the tail, and a fourth
// waiter finds the queue full and is refused at once.
func TestQueueFIFO(t *testing.T) {
	cfg, vs := queueCfg(t, 2, 3, 2*time.Second)
	a := NewAdmission(cfg, 0)
	clk := newManualTimers()
	opts := WaitOptions{Timer: clk.Timer, Now: clk.Now}
	var held [2]Ticket
	for i := range held {
		if _, w, ok := a.Wait(context.Background(), vs, &held[i], opts); !ok || w.Queued {
			t.Fatalf("connection %d: ok=%v waited=%+v, want admitted at once", i, ok, w)
		}
	}
	tickets := make([]Ticket, 4)
	out := make(chan waitResult, 4)
	start := func(i int) {
		go func() {
			r, w, ok := a.Wait(context.Background(), vs, &tickets[i], opts)
			out <- waitResult{i, r, w, ok}
		}()
		<-clk.armed // joined the queue and armed its timeout
	}
	for i := 0; i < 3; i++ {
		start(i)
	}
	if got := a.Snapshot()[1].Queue.Waiting; got != 3 {
		t.Fatalf("waiting %d, want 3", got)
	}
	// The queue is full: the fourth is refused at once, saying so.
	r, w, ok := a.Wait(context.Background(), vs, &tickets[3], opts)
	if ok || !w.Full || !strings.Contains(r.Error(), "queue full (3 waiting)") || !strings.Contains(r.Error(), `virtual server "web": maxConnections 2 reached`) {
		t.Fatalf("fourth: ok=%v %+v %q, want refused, queue full", ok, w, r.Error())
	}
	clk.advance(100 * time.Millisecond)
	open := []*Ticket{&held[0], &held[1]}
	for want := 0; want < 3; want++ {
		open[0].Release() // a slot frees: the queue's head takes it
		open = open[1:]
		res := <-out
		if !res.ok || res.i != want || res.w.Duration != time.Duration(want+1)*100*time.Millisecond {
			t.Fatalf("admitted %d after %v (ok=%v), want %d after %v", res.i, res.w.Duration, res.ok, want, time.Duration(want+1)*100*time.Millisecond)
		}
		open = append(open, &tickets[res.i])
		clk.advance(100 * time.Millisecond)
	}
	st := a.Snapshot()[1]
	if st.Conns != 2 || st.Queue.Waiting != 0 || st.Queue.Waits != 3 || st.Queue.Served != 3 || st.Queue.Full != 1 || st.Queue.TimedOut != 0 {
		t.Fatalf("level %+v, want 2 open, queue: 3 waits served, 1 full", st)
	}
	if st.Queue.Waited != 600*time.Millisecond {
		t.Fatalf("waited %v in all, want 100+200+300 ms", st.Queue.Waited)
	}
	for _, tk := range open {
		tk.Release()
	}
}

// TestQueueNewArrivalWaitsBehind: a slot freed while the queue holds a
// waiter goes to that waiter, not to a connection arriving at that moment,
// even before the waiter has run.
func TestQueueNewArrivalWaitsBehind(t *testing.T) {
	cfg, vs := queueCfg(t, 1, 4, 2*time.Second)
	a := NewAdmission(cfg, 0)
	clk := newManualTimers()
	opts := WaitOptions{Timer: clk.Timer, Now: clk.Now}
	var first, second Ticket
	if _, _, ok := a.Wait(context.Background(), vs, &first, opts); !ok {
		t.Fatal("first refused")
	}
	out := make(chan waitResult, 2)
	go func() {
		r, w, ok := a.Wait(context.Background(), vs, &second, opts)
		out <- waitResult{1, r, w, ok}
	}()
	<-clk.armed
	// A plain Admit (no queue) finds the slot the queue's: refused.
	first.Release()
	var third Ticket
	if _, ok := a.Admit(vs, &third); ok {
		// The waiter took it first and the level is full, or the queue
		// held it back: either way a new arrival must not get it.
		t.Fatal("a new arrival took the slot freed for the queue's head")
	}
	if res := <-out; !res.ok {
		t.Fatalf("the waiter was not admitted: %v", res.ref.Error())
	}
	second.Release()
}

// TestQueueTimeout: a waiter still queued when queueTimeout passes is
// refused with the limit named and the time waited.
func TestQueueTimeout(t *testing.T) {
	cfg, vs := queueCfg(t, 1, 2, 2*time.Second)
	a := NewAdmission(cfg, 0)
	clk := newManualTimers()
	opts := WaitOptions{Timer: clk.Timer, Now: clk.Now}
	var held, t2 Ticket
	if _, _, ok := a.Wait(context.Background(), vs, &held, opts); !ok {
		t.Fatal("first refused")
	}
	out := make(chan waitResult, 1)
	go func() {
		r, w, ok := a.Wait(context.Background(), vs, &t2, opts)
		out <- waitResult{0, r, w, ok}
	}()
	<-clk.armed
	clk.advance(1999 * time.Millisecond)
	select {
	case res := <-out:
		t.Fatalf("left the queue before its timeout: %+v", res)
	default:
	}
	clk.advance(time.Millisecond)
	res := <-out
	want := `virtual server "web": maxConnections 1 reached (1 open); waited 2s in the queue`
	if res.ok || !res.w.TimedOut || res.w.Duration != 2*time.Second || res.ref.Error() != want {
		t.Fatalf("ok=%v %+v %q, want timed out: %q", res.ok, res.w, res.ref.Error(), want)
	}
	if t2.Admitted() {
		t.Fatal("a timed-out waiter holds a ticket")
	}
	st := a.Snapshot()[1]
	if st.Conns != 1 || st.Queue.TimedOut != 1 || st.Queue.Waiting != 0 {
		t.Fatalf("level %+v, want 1 open, 1 timed out, none waiting", st)
	}
	// The level admits again once the slot frees.
	held.Release()
	if _, _, ok := a.Wait(context.Background(), vs, &t2, opts); !ok {
		t.Fatal("refused with the slot free and nobody queued")
	}
	t2.Release()
}

// TestQueueClient: a client's queue works as a level's: client A's third
// connection waits at its maxConnections 2 while client B is admitted.
func TestQueueClient(t *testing.T) {
	vs := &VirtualServer{Name: "web", Ports: PortRange{80, 80}, VIPs: []netip.Addr{netip.MustParseAddr("10.0.0.1")},
		ClientLimits: ClientLimits{Limits: Limits{MaxConnections: 2, EnforceConnections: true, Queue: 1, QueueTimeout: time.Second}}}
	cfg, err := Compile(&Config{Services: []*VirtualServer{vs}})
	if err != nil {
		t.Fatal(err)
	}
	a := NewAdmission(cfg, 0)
	clk := newManualTimers()
	ca, cb := netip.MustParseAddr("198.18.5.1"), netip.MustParseAddr("198.18.5.2")
	var ta [3]Ticket
	var tb Ticket
	for i := 0; i < 2; i++ {
		if _, _, ok := a.Wait(context.Background(), vs, &ta[i], WaitOptions{Client: ca, Timer: clk.Timer, Now: clk.Now}); !ok {
			t.Fatalf("A's connection %d refused", i)
		}
	}
	out := make(chan waitResult, 1)
	go func() {
		r, w, ok := a.Wait(context.Background(), vs, &ta[2], WaitOptions{Client: ca, Timer: clk.Timer, Now: clk.Now})
		out <- waitResult{2, r, w, ok}
	}()
	<-clk.armed
	if _, ok := a.AdmitClient(vs, cb, &tb); !ok {
		t.Fatal("client B refused while A waits")
	}
	clk.advance(time.Second)
	res := <-out
	if want := "client 198.18.5.1: maxConnections 2 reached (2 open); waited 1s in the queue"; res.ok || res.ref.Error() != want {
		t.Fatalf("A's third: ok=%v %q, want %q", res.ok, res.ref.Error(), want)
	}
	cs := a.Clients()
	if len(cs) != 1 || cs[0].Clients != 2 || cs[0].Queue.TimedOut != 1 || cs[0].Refused == 0 {
		t.Fatalf("client table %+v", cs)
	}
	ta[0].Release()
	ta[1].Release()
	tb.Release()
	if cs := a.Clients(); cs[0].Active != 0 {
		t.Fatalf("active clients %d after every release, want 0", cs[0].Active)
	}
}

// TestQueueSharedBorrow: at a cluster-wide limit whose share here is full
// (SetCapacity), a connection borrows first (Retry); when the cluster
// cannot lend it waits in the queue, asking again at each ShareRetry,
// and is admitted once a borrow grows the share. Nothing is held while
// Retry runs (it takes the control plane's lock through SetCapacity).
func TestQueueSharedBorrow(t *testing.T) {
	cfg, vs := queueCfg(t, 4, 4, 2*time.Second)
	a := NewAdmission(cfg, 0)
	if _, ok := a.SetCapacity(LevelVirtualServer, "web", 1); !ok {
		t.Fatal("no level web")
	}
	clk := newManualTimers()
	var calls int
	retry := func(_ context.Context, r Refusal) bool {
		calls++
		if !r.Shared {
			t.Errorf("Retry for a refusal that is not a share's: %v", r.Error())
		}
		if calls < 3 {
			return false // the cluster has nothing to lend yet
		}
		a.SetCapacity(LevelVirtualServer, "web", 2)
		return true
	}
	opts := WaitOptions{Timer: clk.Timer, Now: clk.Now, Retry: retry, ShareRetry: 100 * time.Millisecond}
	var first, second Ticket
	if _, _, ok := a.Wait(context.Background(), vs, &first, opts); !ok {
		t.Fatal("first refused")
	}
	out := make(chan waitResult, 1)
	go func() {
		r, w, ok := a.Wait(context.Background(), vs, &second, opts)
		out <- waitResult{0, r, w, ok}
	}()
	<-clk.armed // the queue timeout
	<-clk.armed // the first share poll
	clk.advance(100 * time.Millisecond)
	res := <-out
	if !res.ok || !res.w.Queued || res.w.Duration != 100*time.Millisecond || calls != 3 {
		t.Fatalf("ok=%v %+v after %d Retry calls (%v), want admitted from the queue after 100 ms, 3 calls", res.ok, res.w, calls, res.ref.Error())
	}
	first.Release()
	second.Release()
}

// BenchmarkQueueHandoff is the queue's added latency: from the Release
// that frees a slot to the queued connection's admission (a goroutine
// wake-up), reported as ns/handoff. A connection that finds a slot free
// never queues and pays nothing (BenchmarkAdmit).
func BenchmarkQueueHandoff(b *testing.B) {
	cfg, vs := queueCfg(b, 1, 1, time.Minute)
	a := NewAdmission(cfg, 0)
	lv := a.levels[keyOf(LevelVirtualServer, "web")]
	var held Ticket
	if _, ok := a.Admit(vs, &held); !ok {
		b.Fatal("refused")
	}
	var total time.Duration
	for i := 0; i < b.N; i++ {
		var next Ticket
		var freed time.Time
		done := make(chan time.Duration)
		go func() {
			_, _, ok := a.Wait(context.Background(), vs, &next, WaitOptions{})
			if !ok {
				done <- -1
				return
			}
			done <- time.Since(freed)
		}()
		for lv.q.n.Load() == 0 {
			runtime.Gosched()
		}
		freed = time.Now()
		held.Release()
		d := <-done
		if d < 0 {
			b.Fatal("the waiter was refused")
		}
		total += d
		held.c.Store(next.c.Swap(nil))
	}
	b.ReportMetric(float64(total.Nanoseconds())/float64(b.N), "ns/handoff")
}
