package main

import (
	"errors"
	"fmt"
	"io"

	"github.com/spf13/cobra"
)

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
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageErr(err) })
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

// execute runs the command line args with the given output streams and
// returns the process exit status: 0 on success, what a command's exitError
// says, 1 for a usage or config error (cobra's own: an unknown flag or
// command, a bad flag value, wrong arguments; or a usageError), 2 for any
// other error a command returns (a runtime failure). Tests call it
// in-process.
func execute(args []string, stdout, stderr io.Writer) int {
	root := newRootCmd()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	// Cobra reports its own errors before a command's hooks run: an error
	// with no command started is a usage error.
	started := false
	root.PersistentPreRun = func(*cobra.Command, []string) { started = true }
	err := root.Execute()
	if err == nil {
		return exitOK
	}
	var ee *exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	fmt.Fprintf(stderr, "weir: %v\nRun 'weir --help' for usage.\n", err)
	var ue *usageError
	if !started || errors.As(err, &ue) {
		return exitUsage
	}
	return exitRuntime
}
