// Command archiver copies every record of the PROMPTS audit stream into the prompts table of
// ClickHouse, once per event id, so the audit outlives the stream's retention at a fraction of
// its size (docs/operating.md, "The prompts archive").
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
		fmt.Fprintln(os.Stderr, "archiver:", err)
		os.Exit(1)
	}
}
