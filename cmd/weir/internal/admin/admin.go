// Package admin is weir's admin HTTP API: /status, /connections, /metrics,
// /healthz, the status page (/ui) and its /history when a history is kept,
// and, behind a flag, /debug/pprof. It serves what its Source returns
// and knows nothing of the datapath: the appliance wiring owns the data.
//
// The server binds 127.0.0.1:9090 by default and refuses a non-loopback
// address unless a bearer token is set, so an appliance is never exposed by
// accident.
package admin

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"weir/cmd/weir/api"
	"weir/cmd/weir/internal/ui"
)

// DefaultAddr is where the admin API listens when Options.Addr is empty.
const DefaultAddr = "127.0.0.1:9090"

// Options configure the admin server. The zero value serves on DefaultAddr
// with no token and no pprof.
type Options struct {
	// Addr is host:port to listen on; empty means DefaultAddr. A host that
	// is not a loopback address requires Token.
	Addr string
	// Token, when set, is required as "Authorization: Bearer <Token>" on
	// every endpoint except /healthz (and /ui/login, where a browser
	// gives it once for a cookie that stands for the header).
	Token string
	// Pprof mounts net/http/pprof under /debug/pprof/.
	Pprof bool
	// History, when set, serves the recent past as JSON at /history and
	// the status page that draws it at /ui (package ui), behind the same
	// token as the rest. It is called per request (ui.Recorder.History).
	History func() api.History
}

// Source provides the data the endpoints serve. Each method is called per
// request and must be safe for concurrent use; the documents (package api)
// are encoded as JSON.
type Source interface {
	// Status is the appliance's state: services, limits, targets and their
	// weight explanations, the last reload error, every counter.
	Status() api.Status
	// Connections lists open connections with both legs' statistics.
	Connections() []api.Connection
	// Healthy returns nil when the appliance is serving.
	Healthy() error
}

// Server is a running admin API.
type Server struct {
	srv *http.Server
	ln  net.Listener
}

// CheckAddr reports whether addr may be served with the given token: a
// non-loopback address needs a token.
func CheckAddr(addr, token string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("admin address %q: %w", addr, err)
	}
	if token != "" {
		return nil
	}
	if host == "localhost" {
		return nil
	}
	ip := net.ParseIP(host)
	if ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("admin address %q is not loopback: set a bearer token (--admin-token or $WEIR_ADMIN_TOKEN) to serve it there", addr)
	}
	return nil
}

// Handler builds the admin API's handler; exported for tests and for
// embedding in another server.
func Handler(opts Options, src Source, g prometheus.Gatherer) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, r *http.Request) { writeJSON(w, src.Status()) })
	mux.HandleFunc("GET /connections", func(w http.ResponseWriter, r *http.Request) { writeJSON(w, src.Connections()) })
	mux.Handle("GET /metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError}))
	if opts.History != nil {
		mux.HandleFunc("GET /history", func(w http.ResponseWriter, r *http.Request) { writeJSON(w, opts.History()) })
		page := ui.Handler(opts.History)
		mux.Handle("GET /ui", page)
		mux.Handle("GET /ui/", page)
	}
	if opts.Pprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	authed := requireToken(opts.Token, mux)

	root := http.NewServeMux()
	root.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		if err := src.Healthy(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	if opts.History != nil && opts.Token != "" {
		// A browser cannot send the bearer header: it signs in once, and
		// a cookie carrying the token stands for the header.
		root.HandleFunc("GET /ui/login", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			fmt.Fprint(w, loginPage)
		})
		root.HandleFunc("POST /ui/login", func(w http.ResponseWriter, r *http.Request) {
			if subtle.ConstantTimeCompare([]byte(r.PostFormValue("token")), []byte(opts.Token)) != 1 {
				http.Error(w, "wrong token", http.StatusUnauthorized)
				return
			}
			http.SetCookie(w, &http.Cookie{Name: tokenCookie, Value: opts.Token, Path: "/",
				HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
			http.Redirect(w, r, "/ui", http.StatusSeeOther)
		})
	}
	root.Handle("/", authed)
	return root
}

// tokenCookie carries the token for a browser that signed in at /ui/login.
const tokenCookie = "weir_admin_token"

const loginPage = `<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>weir: sign in</title></head>
<body><form method="post" action="/ui/login"><label>admin token <input type="password" name="token" autofocus></label>
<button type="submit">open the status page</button></form></body></html>
`

func requireToken(token string, next http.Handler) http.Handler {
	if token == "" {
		return next
	}
	want := []byte("Bearer " + token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got := []byte(r.Header.Get("Authorization"))
		if c, err := r.Cookie(tokenCookie); err == nil && len(got) == 0 {
			got = []byte("Bearer " + c.Value)
		}
		if subtle.ConstantTimeCompare(got, want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="weir"`)
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
	}
}

// Listen validates opts and binds the listener, so an address in use is
// reported before the appliance starts serving traffic.
func Listen(opts Options, src Source, g prometheus.Gatherer) (*Server, error) {
	if opts.Addr == "" {
		opts.Addr = DefaultAddr
	}
	if err := CheckAddr(opts.Addr, opts.Token); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", opts.Addr)
	if err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			return nil, fmt.Errorf("admin API: %s is in use (another weir running? choose another with --admin HOST:PORT): %w", opts.Addr, err)
		}
		return nil, fmt.Errorf("admin API: %w", err)
	}
	s := &Server{
		ln: ln,
		srv: &http.Server{
			Handler:           Handler(opts, src, g),
			ReadHeaderTimeout: 5 * time.Second,
			IdleTimeout:       60 * time.Second,
		},
	}
	return s, nil
}

// Addr is the bound address (useful with port 0).
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Serve serves until Shutdown; it runs in the caller's goroutine.
func (s *Server) Serve() error {
	if err := s.srv.Serve(s.ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// Shutdown stops the server, waiting for in-flight requests until ctx ends.
func (s *Server) Shutdown(ctx context.Context) error { return s.srv.Shutdown(ctx) }
