package main

import (
	"errors"
	"fmt"
	"io"

	"github.com/spf13/cobra"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

// buildCommands are subcommands only some builds have: a file behind a build
// tag appends its constructor in an init (gendocs.go, -tags weirdocs, for the
// Debian package's man pages and completions).
var buildCommands []func() *cobra.Command

// newRootCmd builds the command tree. Each subcommand is built by a
// newXxxCmd function in its own file; add new ones here.
func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "weir",
		Short: "weir is a userspace packet-level QoS appliance and load balancer",
		Long: "weir captures traffic into a userspace TCP/IP stack, measures every connection,\n" +
			"enforces Sun-style QoS limits and balances over targets whose weights follow\n" +
			"the measured TCP quality (z/OS Sysplex Distributor style).",
		Version:       version,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetVersionTemplate("weir {{.Version}}\n")
	root.AddCommand(
		newRunCmd(),
		newCheckCmd(),
		newStatusCmd(),
		newDemoCmd(),
		newVersionCmd(),
	)
	for _, c := range buildCommands {
		root.AddCommand(c())
	}
	return root
}

// exitError makes execute return code without printing anything more: the
// command has already reported what went wrong.
type exitError struct{ code int }

func (e *exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

// execute runs the command line args with the given output streams and
// returns the process exit status: 0 on success, what a command's exitError
// says, or 2 for a usage error. Tests call it in-process.
func execute(args []string, stdout, stderr io.Writer) int {
	root := newRootCmd()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.Execute()
	if err == nil {
		return 0
	}
	var ee *exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	fmt.Fprintf(stderr, "weir: %v\nRun 'weir --help' for usage.\n", err)
	return 2
}
