//go:build wasip1

// A builder that prints without end.
package main

import (
	"os"
	"strings"
)

func main() {
	line := strings.Repeat("x", 4096)
	for {
		if _, err := os.Stdout.WriteString(line); err != nil {
			os.Exit(4)
		}
	}
}
