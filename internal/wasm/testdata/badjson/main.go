//go:build wasip1

// A builder that prints something that is not its answer.
package main

import "fmt"

func main() { fmt.Println(`{"messages": [{"role": "user", "content": "unterminated`) }
