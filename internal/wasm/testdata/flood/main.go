//go:build wasip1

// A builder that prints without end (a command, or a reactor: -buildmode=c-shared).
package main

import (
	"os"
	"strings"
)

func main() { os.Exit(int(run())) }

//go:wasmexport podium_run
func podiumRun() int32 { return run() }

func run() int32 {
	line := strings.Repeat("x", 4096)
	for {
		if _, err := os.Stdout.WriteString(line); err != nil {
			return 4
		}
	}
}
