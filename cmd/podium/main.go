// Command podium is the tool of the people around the pipeline: auditors check that every
// recorded prompt is what the composer produced, operators read standings and histories, publish
// events by hand and replay dead letters. It talks to the same NATS and ClickHouse as the
// services, configured by the same environment.
package main

import (
	"errors"
	"fmt"

	_ "time/tzdata" // request timezones must resolve as the composer resolves them

	"github.com/podium-llm/podium/internal/process"
)

func main() { process.Main("podium", run, exitCode) }

// Exit codes, as `podium help` documents them.
const (
	exitOK       = 0
	exitMismatch = 1 // a check failed: a record differs, an event is still invalid
	exitUsage    = 2 // bad arguments or configuration
	exitFailure  = 3 // NATS or ClickHouse could not be used
)

// usageError marks an error of the command line.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg + " (see podium help)" }

func usagef(format string, args ...any) error { return &usageError{fmt.Sprintf(format, args...)} }

// checkError marks a check that ran and failed.
type checkError struct{ msg string }

func (e *checkError) Error() string { return e.msg }

func exitCode(err error) int {
	var u *usageError
	var c *checkError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &u):
		return exitUsage
	case errors.As(err, &c):
		return exitMismatch
	}
	return exitFailure
}
