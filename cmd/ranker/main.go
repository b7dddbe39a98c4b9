// Command ranker consumes evaluation.completed from JetStream, stores every evaluation in
// ClickHouse exactly once per event id, announces leaderboard.updated after each commit and serves
// leaderboards and team histories over HTTP.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "ranker:", err)
		os.Exit(1)
	}
}
