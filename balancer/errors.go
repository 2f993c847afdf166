package balancer

//go:generate go run golang.org/x/tools/cmd/stringer@v0.52.0 -type=Why -linecomment -output=why_string.go
import (
	"strconv"
	"strings"
	"time"
)

// Why says why a target could not take a connection.
type Why uint8

const (
	// AtLimit: the target has MaxConnections open connections.
	AtLimit Why = iota // at limit
	// Down: a connect failed and the retry interval has not passed.
	Down // down
	// HealthDown: active health checks mark the target down.
	HealthDown // health check failed
	// AlreadyTried: this connection was already given the target (PickAction's tried).
	AlreadyTried // already tried
	// Draining: the target is configured with weight 0 and takes no new
	// connection.
	Draining // draining (weight 0)
	// Ejected: outlier ejection took the target out (balancer.ejection)
	// until Until.
	Ejected // ejected
)

// Reason is one target's part in a refusal.
type Reason struct {
	Target string
	Why    Why
	Open   int64 // open connections, for AtLimit
	Max    int64 // MaxConnections, for AtLimit
	// Shared: AtLimit at this instance's share of a cluster-wide Max,
	// Share slots, below Max.
	Shared bool
	Share  int64
	Until  time.Time // end of the retry interval, for Down
}

// String renders the reason as the 503 page and log line show it:
// "a (at limit 3/3)", "b (down until 12:00:05)", "c (draining (weight 0))".
func (r Reason) String() string {
	var sb strings.Builder
	r.write(&sb)
	return sb.String()
}

func (r Reason) write(sb *strings.Builder) {
	sb.WriteString(r.Target)
	sb.WriteString(" (")
	switch r.Why {
	case AtLimit:
		if r.Shared {
			// "at share 2/2 of cluster-wide limit 4"
			sb.WriteString("at share ")
			sb.WriteString(strconv.FormatInt(r.Open, 10))
			sb.WriteByte('/')
			sb.WriteString(strconv.FormatInt(r.Share, 10))
			sb.WriteString(" of cluster-wide limit ")
			sb.WriteString(strconv.FormatInt(r.Max, 10))
			break
		}
		sb.WriteString("at limit ")
		sb.WriteString(strconv.FormatInt(r.Open, 10))
		sb.WriteByte('/')
		sb.WriteString(strconv.FormatInt(r.Max, 10))
	case Down:
		sb.WriteString("down until ")
		sb.WriteString(r.Until.Format("15:04:05"))
	default:
		sb.WriteString(r.Why.String())
	}
	sb.WriteByte(')')
}

// maxReasons bounds the reasons a NoTargetError lists, so that a refusal over
// thousands of targets stays one small allocation and a readable line.
const maxReasons = 16

// NoTargetError is returned by PickAction when no target can take the connection.
// Its message is the text of the 503 page and the log line:
//
//	all targets unavailable: a (at limit 3/3), b (down until 12:00:05), c (draining (weight 0))
//
// or, when a connection has used up its attempts,
//
//	gave up after 3 attempts: a (down until 12:00:05), b (down until 12:00:05), c (at limit 4/4)
type NoTargetError struct {
	Service string // the virtual server's name
	// Attempts is the number of targets this connection was given before
	// (PickAction's tried); 0 for a first pick.
	Attempts int
	// Exhausted is set when the connection used up MaxAttempts; Reasons then
	// list the targets it tried.
	Exhausted bool
	// Reasons lists the first targets, primaries then backups, each with why
	// it could not serve; More counts those left out.
	Reasons []Reason
	More    int

	buf    [maxReasons]Reason
	picked int // refuse found a target after all: its index; else -1
}

// Error returns the refusal text: the 503 page body and the log line.
func (e *NoTargetError) Error() string {
	var sb strings.Builder
	if e.Exhausted {
		sb.WriteString("gave up after ")
		sb.WriteString(strconv.Itoa(e.Attempts))
		sb.WriteString(" attempts: ")
	} else {
		sb.WriteString("all targets unavailable: ")
	}
	if len(e.Reasons) == 0 {
		sb.WriteString("no targets configured")
	}
	for i, r := range e.Reasons {
		if i > 0 {
			sb.WriteString(", ")
		}
		r.write(&sb)
	}
	if e.More > 0 {
		sb.WriteString(" and ")
		sb.WriteString(strconv.Itoa(e.More))
		sb.WriteString(" more")
	}
	return sb.String()
}

func (e *NoTargetError) addReason(r Reason) {
	if len(e.Reasons) < maxReasons {
		e.Reasons = append(e.Reasons, r)
	} else {
		e.More++
	}
}

// refuse builds the refusal at now. Unless exhausted, it makes one last pass
// over every target, primaries then backups, and reserves the first that can
// serve after all (a slot freed since the fast paths looked): picked is then
// its index and the error is to be dropped.
func (t *table) refuse(now time.Time, tried *Tried, exhausted bool, sk *skipSet) *NoTargetError {
	e := &NoTargetError{Service: t.vs.Name, Exhausted: exhausted, picked: -1}
	e.Reasons = e.buf[:0]
	if tried != nil {
		e.Attempts = tried.n
	}
	ns := now.UnixNano()
	reason := func(i int) (Reason, bool) {
		en := &t.entries[i]
		r := Reason{Target: en.t.Name}
		switch {
		case tried.has(en.st) && !exhausted:
			r.Why = AlreadyTried
		case en.base <= 0:
			r.Why = Draining
		case en.st.healthDown.Load():
			r.Why = HealthDown
		case ns < en.st.downUntil.Load():
			r.Why, r.Until = Down, time.Unix(0, en.st.downUntil.Load()).In(now.Location())
		case ns < en.st.ejectedUntil.Load():
			r.Why, r.Until = Ejected, time.Unix(0, en.st.ejectedUntil.Load()).In(now.Location())
		default:
			if exhausted {
				return Reason{}, false
			}
			if en.st.reserve(en.max, sk) {
				return r, true
			}
			r.Why, r.Open, r.Max = AtLimit, en.st.open.Load(), en.max
			if lim := en.st.limit(en.max); lim < en.max {
				r.Shared, r.Share = true, lim
			}
		}
		return r, false
	}
	if exhausted {
		// List what the connection tried, in configured order.
		for i := range t.entries {
			if !tried.has(t.entries[i].st) {
				continue
			}
			r, _ := reason(i)
			if r.Target == "" {
				r = Reason{Target: t.entries[i].t.Name, Why: AlreadyTried}
			}
			e.addReason(r)
		}
		return e
	}
	for i := range t.entries {
		r, ok := reason(i)
		if ok {
			e.picked = i
			return e
		}
		e.addReason(r)
	}
	return e
}
