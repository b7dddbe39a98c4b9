//go:build wasip1

// A builder that reads a file of the host.
package main

import (
	"fmt"
	"os"
)

func main() {
	b, err := os.ReadFile("/etc/passwd")
	if err != nil {
		fmt.Fprintln(os.Stderr, "cannot read /etc/passwd:", err)
		os.Exit(3)
	}
	fmt.Printf(`{"messages":[{"role":"user","content":%q}]}`, b)
}
