package testenv

import "github.com/podium-llm/podium/internal/wasm"

// Modules written byte by byte (the WebAssembly binary format is small), for the tests of what a
// hostile prompt builder may declare or do: each declares or grows one resource a module can make
// its host allocate besides linear memory.

// U32 is an unsigned LEB128 number.
func U32(v uint32) []byte { return wasm.AppendU32(nil, v) }

// S32 is a signed LEB128 number.
func S32(v int32) []byte {
	var b []byte
	for {
		c := byte(v & 0x7f)
		v >>= 7
		if (v == 0 && c&0x40 == 0) || (v == -1 && c&0x40 != 0) {
			return append(b, c)
		}
		b = append(b, c|0x80)
	}
}

// Section is a section of the binary format: its id, its size, its content.
func Section(id byte, content ...[]byte) []byte {
	var all []byte
	for _, c := range content {
		all = append(all, c...)
	}
	return append(append([]byte{id}, U32(uint32(len(all)))...), all...)
}

// WasmCommand is a module with one function, exported as _start, whose body is locals (the locals
// declaration) then code, and the extra sections given by id (replacing the defaults).
func WasmCommand(locals, code []byte, extra map[byte][]byte) []byte {
	m := []byte("\x00asm\x01\x00\x00\x00")
	body := append(append(append([]byte{}, locals...), code...), 0x0b)
	sections := map[byte][]byte{
		1:  Section(1, []byte{1, 0x60, 0, 0}), // one type: () -> ()
		3:  Section(3, []byte{1, 0}),          // one function of it
		7:  Section(7, []byte{1, 6}, []byte("_start"), []byte{0, 0}),
		10: Section(10, []byte{1}, U32(uint32(len(body))), body),
	}
	for id, s := range extra {
		sections[id] = s
	}
	for _, id := range []byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 10, 11} {
		m = append(m, sections[id]...)
	}
	return m
}

// NoLocals declares a function without locals.
var NoLocals = []byte{0}

// WasmTable is a funcref table's declaration: with a maximum when hasMax.
func WasmTable(min, max uint32, hasMax bool) []byte {
	if !hasMax {
		return append([]byte{0x70, 0}, U32(min)...)
	}
	return append(append([]byte{0x70, 1}, U32(min)...), U32(max)...)
}

// TableGrow is code that grows table 0 by n slots (table.grow, its result dropped).
func TableGrow(n int32) []byte {
	code := append([]byte{0xd0, 0x70, 0x41}, S32(n)...) // ref.null func; i32.const n
	return append(code, 0xfc, 0x0f, 0, 0x1a)            // table.grow 0; drop
}
