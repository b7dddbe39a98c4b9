// Package panics is the one place a panic is recovered. A step that panics on one input (a
// handler on a message, the ClickHouse driver on a row, the mustache library on a template) would
// panic again on every replica the input is redelivered to and crash them one after the other;
// Catch turns the panic into an error of that input alone, with its stack for the log.
package panics

import (
	"fmt"
	"runtime/debug"
)

// Panic is a recovered panic: the value it panicked with and the stack where it did.
type Panic struct {
	Value any
	Stack string
}

func (p *Panic) Error() string { return fmt.Sprintf("panicked: %v", p.Value) }

// Catch runs fn and returns the panic it ended with, or nil when it returned.
func Catch(fn func()) (p *Panic) {
	defer func() {
		if v := recover(); v != nil {
			p = &Panic{Value: v, Stack: string(debug.Stack())}
		}
	}()
	fn()
	return nil
}
