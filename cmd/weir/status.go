package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"weir/cmd/weir/api"
	"weir/cmd/weir/internal/admin"
	"weir/cmd/weir/internal/view"
)

func newStatusCmd() *cobra.Command {
	var (
		addr, token string
		raw, watch  bool
		interval    time.Duration
	)
	cmd := &cobra.Command{
		Use:   "status",
		Short: "show a running weir's limits, connections, targets and weights",
		Long: "status asks a running weir's admin API (/status) and prints readable tables: the QoS\n" +
			"levels with connections and bandwidth against their limits, and each virtual server's\n" +
			"targets with base weight, loss and timeout fractions, action fraction, effective\n" +
			"weight, open/max connections and health. Below them it names what changed since the\n" +
			"previous sampling interval (from /history): effective weights, refusals, reloads.\n\n" +
			"With --watch it redraws the tables every --interval, like top, naming what changed\n" +
			"since the previous refresh, until Ctrl-C.",
		Example: "  weir status\n  weir status --watch --interval 1s\n  weir status --json | jq .services",
		RunE: func(cmd *cobra.Command, args []string) error {
			c := &http.Client{Timeout: 5 * time.Second}
			if watch {
				if raw {
					return usageErr(errors.New("--watch and --json: choose one"))
				}
				if interval < 100*time.Millisecond {
					return usageErr(fmt.Errorf("--interval %v: want at least 100ms", interval))
				}
				ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
				defer stop()
				return watchStatus(ctx, cmd.OutOrStdout(), c, addr, token, interval)
			}
			return runStatus(cmd.OutOrStdout(), c, addr, token, raw)
		},
	}
	cmd.Flags().StringVar(&addr, "addr", admin.DefaultAddr, "admin API `HOST:PORT`")
	cmd.Flags().StringVar(&token, "token", "", "bearer `TOKEN` for the admin API")
	cmd.Flags().BoolVar(&raw, "json", false, "print the raw JSON")
	cmd.Flags().BoolVarP(&watch, "watch", "w", false, "redraw every --interval until Ctrl-C, naming what changed since the previous refresh")
	cmd.Flags().DurationVar(&interval, "interval", 2*time.Second, "`DURATION` between refreshes with --watch")
	return cmd
}

// get fetches one admin API document.
func get(c *http.Client, addr, token, path string) ([]byte, error) {
	req, err := http.NewRequest("GET", "http://"+addr+path, nil)
	if err != nil {
		return nil, err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, fmt.Errorf("no weir answering at %s (is `weir run` up? --addr?): %w", addr, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s%s: %s: %s", addr, path, resp.Status, body)
	}
	return body, nil
}

func fetchStatus(c *http.Client, addr, token string) (api.Status, error) {
	var st api.Status
	body, err := get(c, addr, token, "/status")
	if err != nil {
		return st, err
	}
	if err := json.Unmarshal(body, &st); err != nil {
		return st, fmt.Errorf("%s/status: %w", addr, err)
	}
	return st, nil
}

// runStatus fetches addr's /status with c and prints it to out: as tables
// followed by what changed in the last sampling interval (when the weir
// keeps a history), or the raw JSON.
func runStatus(out io.Writer, c *http.Client, addr, token string, raw bool) error {
	if raw {
		body, err := get(c, addr, token, "/status")
		if err != nil {
			return err
		}
		_, err = out.Write(body)
		return err
	}
	st, err := fetchStatus(c, addr, token)
	if err != nil {
		return err
	}
	if err := view.WriteTable(out, st); err != nil {
		return err
	}
	// An older weir serves no /history: then there is nothing to compare.
	body, err := get(c, addr, token, "/history")
	if err != nil {
		return nil
	}
	var h api.History
	if json.Unmarshal(body, &h) != nil {
		return nil
	}
	return view.WriteChanges(out, time.Time{}, view.HistoryChanges(h))
}

// watchStatus redraws the tables every interval until ctx ends, each frame
// naming what changed since the one before. A weir that stops answering is
// said on the screen and asked again.
func watchStatus(ctx context.Context, out io.Writer, c *http.Client, addr, token string, interval time.Duration) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	var prev api.Status
	var prevAt time.Time
	for {
		st, err := fetchStatus(c, addr, token)
		fmt.Fprint(out, "\033[H\033[2J") // home and clear, as top redraws
		now := time.Now()
		fmt.Fprintf(out, "weir status --watch: every %v, %s (Ctrl-C ends)\n\n", interval, now.Format(time.TimeOnly))
		if err != nil {
			fmt.Fprintf(out, "%v\n", err)
		} else {
			if err := view.WriteTable(out, st); err != nil {
				return err
			}
			if !prevAt.IsZero() {
				if err := view.WriteChanges(out, prevAt, view.Changes(prev, st)); err != nil {
					return err
				}
			}
			prev, prevAt = st, now
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
