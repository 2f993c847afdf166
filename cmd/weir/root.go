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

// The exit statuses of every command.
const (
	exitOK      = 0
	exitUsage   = 1 // a usage or config error: the command line or a file is wrong, nothing started
	exitRuntime = 2 // a runtime failure: the command was right, the system said no
)

// exitError makes execute return code without printing anything more: the
// command has already reported what went wrong.
type exitError struct{ code int }

func (e *exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

// usageError marks an error of the command line or of a config file: exit
// status 1.
type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

// usageErr marks err as a usage or config error (exit status 1).
func usageErr(err error) error {
	if err == nil {
		return nil
	}
	return &usageError{err}
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
