// Command console serves the read-only web console of Podium: executions, leaderboards over
// rounds, each team's prompts and diffs, templates and dead letters, live. It reads the same
// NATS and ClickHouse as the services, configured by the same environment.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	_ "time/tzdata" // verify resolves request timezones as the composer does
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "console:", err)
		os.Exit(1)
	}
}
