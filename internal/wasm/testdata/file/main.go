//go:build wasip1

// A builder that reads a file of the host (a command, or a reactor: -buildmode=c-shared).
package main

import (
	"fmt"
	"os"
)

func main() { os.Exit(int(run())) }

//go:wasmexport podium_run
func podiumRun() int32 { return run() }

func run() int32 {
	b, err := os.ReadFile("/etc/passwd")
	if err != nil {
		fmt.Fprintln(os.Stderr, "cannot read /etc/passwd:", err)
		return 3
	}
	fmt.Printf(`{"messages":[{"role":"user","content":%q}]}`, b)
	return 0
}
