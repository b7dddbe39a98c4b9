//go:build wasip1

// A reactor (-buildmode=c-shared) that remembers what it can between calls: a counter, the inputs
// it read, a goroutine's work and a file it wrote; asked to, it closes its stdin and stdout. Started
// from the same snapshot, every call must answer alike.
package main

import (
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"syscall"
)

func main() {}

var (
	calls int
	seen  []string
	ticks = make(chan int, 1000)
	byKey = map[string]int{}
)

//go:wasmexport podium_run
func podiumRun() int32 {
	calls++
	in, _ := io.ReadAll(os.Stdin)
	seen = append(seen, string(in))
	byKey[string(in)]++
	go func() { ticks <- calls }()
	wrote := os.WriteFile("/tmp/state", in, 0o644) == nil
	if strings.Contains(string(in), "close") {
		_ = syscall.Close(0) // closes nothing (the host's fd_close): the next call keeps them
		_ = syscall.Close(1)
	}
	keys := make([]string, 0, len(byKey))
	for k := range byKey {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	fmt.Printf(`{"messages":[{"role":"user","content":"calls %d, inputs seen %d, queued %d, wrote %v, keys %d, first %q"}]}`,
		calls, len(seen), len(ticks), wrote, len(keys), strings.Join(keys, "|"))
	return 0
}
