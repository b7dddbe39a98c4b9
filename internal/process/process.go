// Package process is the one entry of every binary: the stop signals, the run of the command with
// the process's arguments and streams, and the exit status. A cmd/<name>/main.go is this call.
package process

import (
	"context"
	"fmt"
	"io"
	"log"
	"os"
	"os/signal"
	"syscall"

	"github.com/podium-llm/podium/internal/secrets"
)

// Func runs a command until ctx ends (SIGTERM or SIGINT) or it finishes by itself.
type Func func(ctx context.Context, args []string, stdout, stderr io.Writer) error

// Main runs fn as the process named name and exits: 0 when it returned nil, else the error is
// printed behind the name and the status is exitCode(err) (1 when exitCode is nil). Everything the
// command prints goes through the redaction of the secrets the process was given (internal/secrets):
// its logs, its errors, its --help, the final error printed here.
func Main(name string, fn Func, exitCode func(error) int) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	redact := secrets.FromEnv(os.Environ(), true)
	stdout, stderr := redact.ValuesWriter(os.Stdout), redact.Writer(os.Stderr)
	// The log package's logger is the process's (net/http's server errors go there): through the
	// redaction too.
	log.SetOutput(stderr)
	err := fn(ctx, os.Args, stdout, stderr)
	stop()
	if err == nil {
		os.Exit(0)
	}
	fmt.Fprintln(stderr, name+":", err)
	if exitCode == nil {
		os.Exit(1)
	}
	os.Exit(exitCode(err))
}
