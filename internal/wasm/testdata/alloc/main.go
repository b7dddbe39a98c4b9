//go:build wasip1

// A builder that allocates without end (a command, or a reactor: -buildmode=c-shared).
package main

import "fmt"

func main() { run() }

//go:wasmexport podium_run
func podiumRun() int32 { return run() }

func run() int32 {
	var kept [][]byte
	for {
		b := make([]byte, 1<<20)
		b[0] = 1
		kept = append(kept, b)
		if len(kept) < 0 {
			fmt.Println(len(kept))
		}
	}
}
