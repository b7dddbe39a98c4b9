// Command composer answers every round.requested with a prompt.composed (or a prompt.failed): it
// waits until the ranker has committed every evaluation acknowledged before the request, reads the
// team's history and the leaderboard from ClickHouse, renders the template and publishes the
// prompt to the PROMPTS audit stream. Replicas share the work through one durable consumer.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	_ "time/tzdata" // request timezones must resolve the same on every machine
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "composer:", err)
		os.Exit(1)
	}
}
