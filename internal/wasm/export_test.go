package wasm

// Mapped is how many instances' memory mappings are not given back yet.
func (e *Engine) Mapped() int64 { return e.mapped.Load() }

// KindOf reads a module's kind and, for a reactor, the bytes compiled (reactor.go).
var KindOf = kindOf

// Interruptible is the bytes compiled with the deadline's checks (interrupt.go).
var Interruptible = interruptible
