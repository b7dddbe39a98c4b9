//go:build wasip1

// A builder that never ends.
package main

func main() {
	n := 0
	for {
		n++
	}
}
