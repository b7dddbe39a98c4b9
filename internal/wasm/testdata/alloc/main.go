//go:build wasip1

// A builder that allocates without end.
package main

import "fmt"

func main() {
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
