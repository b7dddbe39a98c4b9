//go:build wasip1

// A builder that puts the time it reads into its prompt (a command, or a reactor:
// -buildmode=c-shared).
package main

import (
	"fmt"
	"time"
)

func main() { run() }

//go:wasmexport podium_run
func podiumRun() int32 { return run() }

func run() int32 {
	fmt.Printf(`{"messages":[{"role":"user","content":"it is %s"}]}`, time.Now().Format(time.RFC3339Nano))
	return 0
}
