package main

import "fmt"

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
