//go:build wasip1

// A builder that puts the time it reads into its prompt.
package main

import (
	"fmt"
	"time"
)

func main() {
	fmt.Printf(`{"messages":[{"role":"user","content":"it is %s"}]}`, time.Now().Format(time.RFC3339Nano))
}
