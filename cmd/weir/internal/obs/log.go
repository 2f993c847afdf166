// Package obs sets up weir's logs: the main log (zerolog, JSON by default,
// console format on a terminal) written through a diode so that a slow
// terminal or disk never blocks the appliance, a keyed rate limiter for lines
// that could repeat per connection, and the access log (one line per
// connection, JSON or Common Log Format).
package obs

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mattn/go-isatty"
	"github.com/rs/zerolog"
	"github.com/rs/zerolog/diode"
)

// Options configure the main log. The zero value writes JSON at info level to
// stderr, or console lines when stderr is a terminal.
type Options struct {
	// Format is "json", "console" or "" (console on a terminal, else JSON).
	Format string
	// Level is a zerolog level name; "" means info.
	Level string
	// Output is where lines go; nil means os.Stderr.
	Output io.Writer
	// Buffer is how many lines the diode holds before dropping the oldest;
	// 0 means 4096.
	Buffer int
}

// Logs is the appliance's main logger and its non-blocking writer.
type Logs struct {
	zerolog.Logger
	diode   diode.Writer
	dropped atomic.Uint64
}

// New builds the main logger.
func New(opts Options) (*Logs, error) {
	out := opts.Output
	if out == nil {
		out = os.Stderr
	}
	format := opts.Format
	if format == "" {
		format = "json"
		if f, ok := out.(*os.File); ok && isatty.IsTerminal(f.Fd()) {
			format = "console"
		}
	}
	switch format {
	case "json":
	case "console":
		out = zerolog.ConsoleWriter{Out: out, TimeFormat: time.TimeOnly, NoColor: !isTTY(out)}
	default:
		return nil, fmt.Errorf("log format %q: want json or console", opts.Format)
	}
	level := zerolog.InfoLevel
	if opts.Level != "" {
		l, err := zerolog.ParseLevel(strings.ToLower(opts.Level))
		if err != nil {
			return nil, fmt.Errorf("log level %q: %w", opts.Level, err)
		}
		level = l
	}
	size := opts.Buffer
	if size <= 0 {
		size = 4096
	}
	l := &Logs{}
	// The diode closes its writer on Close; stderr must outlive the log
	// (weir prints its exit error after), so it gets only the Write method.
	l.diode = diode.NewWriter(writeOnly{out}, size, 10*time.Millisecond, func(missed int) { l.dropped.Add(uint64(missed)) })
	l.Logger = zerolog.New(l.diode).Level(level).With().Timestamp().Logger()
	return l, nil
}

func isTTY(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && isatty.IsTerminal(f.Fd())
}

// Dropped is the number of lines lost because the writer could not keep up.
func (l *Logs) Dropped() uint64 { return l.dropped.Load() }

// Close flushes what the diode holds and stops its goroutine.
func (l *Logs) Close() error { return l.diode.Close() }

// Limiter lets a keyed line through at most once per Every; the lines it
// holds back are counted and reported with the next one let through. It is
// for control-plane paths (per connection at most), not per packet.
type Limiter struct {
	Every time.Duration // minimum spacing per key; 0 means one second

	mu   sync.Mutex
	keys map[string]*limiterKey
}

type limiterKey struct {
	last       time.Time
	suppressed uint64
}

// Allow reports whether the line for key may be written at now, and how many
// were suppressed since the last one allowed.
func (l *Limiter) Allow(key string, now time.Time) (ok bool, suppressed uint64) {
	every := l.Every
	if every <= 0 {
		every = time.Second
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.keys == nil {
		l.keys = make(map[string]*limiterKey)
	}
	k := l.keys[key]
	if k == nil {
		if len(l.keys) > 10000 { // bound memory against key churn
			for key, v := range l.keys {
				if now.Sub(v.last) > every {
					delete(l.keys, key)
				}
			}
		}
		l.keys[key] = &limiterKey{last: now}
		return true, 0
	}
	if now.Sub(k.last) < every {
		k.suppressed++
		return false, 0
	}
	s := k.suppressed
	k.last, k.suppressed = now, 0
	return true, s
}

// writeOnly hides any Close method of the writer it wraps.
type writeOnly struct{ w io.Writer }

func (w writeOnly) Write(p []byte) (int, error) { return w.w.Write(p) }
