//go:build wasip1

// A builder that never ends (a command, or a reactor: -buildmode=c-shared).
package main

func main() { run() }

//go:wasmexport podium_run
func podiumRun() int32 { return run() }

func run() int32 {
	n := 0
	for {
		n++
	}
}
