//go:build wasip1

// A builder that prints something that is not its answer (a command, or a reactor:
// -buildmode=c-shared).
package main

import "fmt"

func main() { run() }

//go:wasmexport podium_run
func podiumRun() int32 { return run() }

func run() int32 {
	fmt.Println(`{"messages": [{"role": "user", "content": "unterminated`)
	return 0
}
