package wasm

// Mapped is how many instances' memory mappings are not given back yet.
func (e *Engine) Mapped() int64 { return e.mapped.Load() }
