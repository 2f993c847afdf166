package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/spf13/cobra"

	"weir/cmd/weir/api"
	"weir/cmd/weir/internal/admin"
	"weir/cmd/weir/internal/view"
)

func newStatusCmd() *cobra.Command {
	var (
		addr, token string
		raw         bool
	)
	cmd := &cobra.Command{
		Use:   "status",
		Short: "show a running weir's limits, connections, targets and weights",
		Long: "status asks a running weir's admin API (/status) and prints readable tables: the QoS\n" +
			"levels with connections and bandwidth against their limits, and each virtual server's\n" +
			"targets with base weight, loss and timeout fractions, action fraction, effective\n" +
			"weight, open/max connections and health.",
		RunE: func(cmd *cobra.Command, args []string) error {
			return runStatus(cmd.OutOrStdout(), &http.Client{Timeout: 5 * time.Second}, addr, token, raw)
		},
	}
	cmd.Flags().StringVar(&addr, "addr", admin.DefaultAddr, "admin API `HOST:PORT`")
	cmd.Flags().StringVar(&token, "token", "", "bearer `TOKEN` for the admin API")
	cmd.Flags().BoolVar(&raw, "json", false, "print the raw JSON")
	return cmd
}

// runStatus fetches addr's /status with c and prints it to out: as tables,
// or the raw JSON.
func runStatus(out io.Writer, c *http.Client, addr, token string, raw bool) error {
	req, err := http.NewRequest("GET", "http://"+addr+"/status", nil)
	if err != nil {
		return err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.Do(req)
	if err != nil {
		return fmt.Errorf("no weir answering at %s (is `weir run` up? --addr?): %w", addr, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s/status: %s: %s", addr, resp.Status, body)
	}
	if raw {
		_, err := out.Write(body)
		return err
	}
	var st api.Status
	if err := json.Unmarshal(body, &st); err != nil {
		return fmt.Errorf("%s/status: %w", addr, err)
	}
	return view.WriteTable(out, st)
}
