package main

import (
	"errors"
	"fmt"
	"io"
	"net/url"

	"github.com/spf13/cobra"

	"weir/policy"
	"weir/policy/config"
)

func newCheckCmd() *cobra.Command {
	var files []string
	cmd := &cobra.Command{
		Use:   "check -c FILE...",
		Short: "validate config files and print what they define",
		Long: "check loads each config file (YAML, or z/OS Policy Agent statements) on its own,\n" +
			"and prints a summary of what it defines: services, targets, limits, rules and\n" +
			"actions, the performance monitor and the balancer. Errors go to stderr, one per\n" +
			"line as file:line:col: reason, and the exit status is 1. Files may also be given\n" +
			"as arguments.",
		Example: "  weir check -c examples/websphere-cluster.yaml\n  weir check examples/*.yaml examples/*.pa",
		RunE: func(cmd *cobra.Command, args []string) error {
			files = append(files, args...)
			if len(files) == 0 {
				return usageErr(errors.New("check: no config file (give -c FILE)"))
			}
			return runCheck(cmd.OutOrStdout(), cmd.ErrOrStderr(), files)
		},
	}
	cmd.Flags().StringArrayVarP(&files, "config", "c", nil, "config `FILE` (YAML or Policy Agent); repeatable")
	return cmd
}

// runCheck loads every file, printing a summary of each good one to stdout
// and every error of each bad one to stderr. It returns an exitError with
// status 1 when any file has errors.
func runCheck(stdout, stderr io.Writer, files []string) error {
	failed := 0
	for i, f := range files {
		cfg, err := config.Load(f)
		if err != nil {
			fmt.Fprintln(stderr, err)
			failed++
			continue
		}
		if i > 0 {
			fmt.Fprintln(stdout)
		}
		fmt.Fprintf(stdout, "%s: ok\n", f)
		if err := writeSummary(stdout, cfg); err != nil {
			return err
		}
		if err := writeClusterSummary(stdout, cfg.Cluster); err != nil {
			return err
		}
		if err := writeMeasurement(stdout, cfg); err != nil {
			return err
		}
		for _, name := range unmonitored(cfg) {
			fmt.Fprintf(stdout, "warning: the monitor is on but no policy rule covers service %s, so its targets' loss and timeout ratios are never measured (monitor.scope: policy). "+
				"Add a rule for it (protocol 6, sourcePorts its port, an action), or set monitor.scope: all to monitor every connection\n", name)
		}
	}
	if failed > 0 {
		fmt.Fprintf(stderr, "weir check: %d of %d config files have errors\n", failed, len(files))
		return &exitError{code: 1}
	}
	return nil
}

// writeClusterSummary prints the cluster section; nothing when there is
// none (the output of a single instance's config is unchanged).
func writeClusterSummary(w io.Writer, cl *policy.Cluster) error {
	if cl == nil {
		return nil
	}
	s := &summary{w: w}
	s.printf("cluster %s: instance %s, redis %s", cl.Name, cl.Instance, redactURL(cl.Redis))
	s.printf("  enforced connection limits shared through leases renewed every %v (a dead instance's slots free after %v)",
		cl.LeaseInterval, policy.LeaseTTLFactor*cl.LeaseInterval)
	s.printf("  Redis unreachable: %s", redisDownText(cl.OnRedisDown))
	return s.err
}

func redisDownText(d policy.RedisDown) string {
	switch d {
	case policy.LocalShare:
		return "localShare (each instance enforces limit ÷ live members)"
	case policy.FailOpen:
		return "failOpen (each instance enforces the whole limit)"
	case policy.FailClosed:
		return "failClosed (enforced connection limits refuse everything)"
	}
	return d.String()
}

// redactURL hides the password of a redis:// URL.
func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.User == nil {
		return s
	}
	return u.Redacted()
}

// unmonitored names the services whose connections the monitor never sees:
// it is on with scope policy (the default) and no rule could match a TCP
// connection of the service (protocol, service port, VIP, service).
func unmonitored(cfg *policy.Config) []string {
	if !cfg.Monitor.Enabled || cfg.Monitor.Scope != policy.ScopePolicy {
		return nil
	}
	var out []string
	for _, vs := range cfg.Services {
		covered := false
		for _, r := range cfg.Rules {
			if r.Covers(vs) {
				covered = true
				break
			}
		}
		if !covered {
			out = append(out, vs.Name)
		}
	}
	return out
}
