package wasm

import (
	"context"
	"errors"
	"fmt"

	"github.com/tetratelabs/wazero/api"
)

// A call must end at its deadline, whatever the builder's code does. wazero can stop compiled code
// (RuntimeConfig.WithCloseOnContextDone), but it does so by leaving the compiled code for the Go
// host at the start of every loop iteration to ask whether the module was closed: a builder's JSON
// parser pays that on every byte it reads. Measured (BenchmarkRunExampleBuilder, the small input):
// the C builder 0.56 ms a call with it and 0.12 ms without, the Go reactor 2.0 ms and 0.78 ms.
//
// So the engine compiles every module without it, and bounds the module's code itself: the bytes
// compiled (not the module's own: it keeps its identity, the sha256 of its bytes) define two more
// mutable globals, and every function starts, and every loop's iteration starts, with a check:
//   - the stop flag (exported as podium.stop) is read: when set, the module traps (unreachable).
//     The host sets it when the call's context ends (armStop), and the engine reports the trap as
//     the deadline (failureOf reads the context). Every instruction a module runs is within a
//     function entered or a loop iteration begun after its last check, and what runs between two
//     checks is straight code of bounded length (recursion enters functions; iteration begins
//     loops);
//   - a countdown: every tickEvery checks the code leaves for Go once (memory.grow by 0 pages, which
//     wazero runs in Go and which changes nothing), as it does before each bulk memory instruction.
//     Go's runtime cannot preempt compiled WebAssembly: a garbage collection that stops the world
//     waits until the code returns to Go, and the goroutine that would set the flag waits for the
//     collection. Without the tick a builder that loops for ever held the whole composer so (found
//     by TestHostileBuilders hanging with the first version of this file, which read only the flag).
// A module without a memory is given one of no pages, for the tick.
//
// The instrumentation reads every instruction of every function body as wazero reads it: a module
// with one it does not know (code.go's reader, plus the SIMD instructions) could not be bounded, and
// is refused; so is a start section, whose function runs as the module is instantiated, before the
// flag is armed. The bytes compiled are valid exactly when the module's are (FuzzInterruptible):
// code, exports or data segments that refer to a global or a memory the module does not have are
// refused, for in the bytes compiled they would be the host's (code writing the flag or the
// countdown would escape both).

// stopExport is the export of the global the host sets to stop a call.
const stopExport = "podium.stop"

// tickEvery is how many checks the code runs between two returns to Go. A return costs about as
// much as a few hundred checks; a loop iteration of the examples' parsers, a few nanoseconds.
const tickEvery = 4096

// interruptible returns wasm with the stop flag and the countdown defined, the flag exported, and
// the check at every function's entry and every loop's start (see the top of this file).
func interruptible(wasm []byte) ([]byte, error) {
	if len(wasm) < 8 || string(wasm[:4]) != "\x00asm" {
		return wasm, nil // not a module: the compiler says so
	}
	type section struct {
		id   byte
		body []byte
	}
	var sections []section
	var imported imports
	definedGlobals, memories := 0, 0
	hasMemories, hasGlobals := false, false
	var exports, data []byte
	err := eachSection(wasm, func(id byte, r *reader) error {
		body := r.b[r.pos:]
		var err error
		switch id {
		case 2:
			if imported, err = importsOf(&reader{b: body}); err != nil {
				return fmt.Errorf("the import section: %w", err)
			}
		case 5:
			n, err := (&reader{b: body}).u32()
			if err != nil {
				return fmt.Errorf("the memory section: %w", err)
			}
			memories, hasMemories = int(n), true
		case 6:
			n, err := (&reader{b: body}).u32()
			if err != nil {
				return fmt.Errorf("the global section: %w", err)
			}
			definedGlobals, hasGlobals = int(n), true
		case 7:
			exports = body
		case 11:
			data = body
		case 8:
			// Its function runs as the module is instantiated, before the host can read the flag
			// to arm it. WASI toolchains make none (the host calls _start or _initialize).
			return errors.New("the module has a start section, whose code runs as it is instantiated, where the host could not stop it at a deadline: a builder starts in _start or _initialize")
		}
		sections = append(sections, section{id, body})
		return nil
	})
	if err != nil {
		return nil, err
	}
	stop := uint32(imported.globals + definedGlobals)
	c := checks{stop: stop, countdown: stop + 1, noMemory: imported.memories+memories == 0}
	// The bytes compiled must be valid exactly when the module's are: what refers to a global or
	// a memory the module does not have would refer to the host's additions (code that writes
	// the flag or the countdown would escape both).
	if err := refuseExports(exports, stop, c.noMemory); err != nil {
		return nil, err
	}
	if c.noMemory && hasActiveData(data) {
		return nil, errors.New("the module writes data segments into a memory it does not have")
	}
	out := append(make([]byte, 0, len(wasm)+len(wasm)/4), wasm[:8]...)
	put := func(id byte, body []byte) {
		out = append(out, id)
		out = AppendU32(out, uint32(len(body)))
		out = append(out, body...)
	}
	// The globals go into the global section, the flag's export into the export section, and a
	// memory of no pages into a memory section: each made where the binary format orders it when
	// the module has none.
	globals := []byte{0x7f, 0x01, 0x41, 0x00, 0x0b}                                                 // the flag: a mutable i32, 0
	globals = append(append(append(globals, 0x7f, 0x01, 0x41), appendS32(nil, tickEvery)...), 0x0b) // the countdown
	export := append(AppendU32(nil, uint32(len(stopExport))), stopExport...)
	export = append(export, 0x03)
	export = AppendU32(export, stop)
	pending := map[byte][]byte{}
	switch {
	case c.noMemory && hasMemories:
		pending[5] = nil // an empty memory section: given the memory below
	case c.noMemory:
		pending[5] = []byte{0x01, 0x01, 0x00, 0x00} // one memory: 0 pages, at most 0
	}
	if !hasGlobals {
		pending[6] = append([]byte{0x02}, globals...)
	}
	pending[7] = append([]byte{0x01}, export...) // unless the module has an export section (below)
	for _, s := range sections {
		for _, id := range []byte{5, 6, 7} {
			if body, ok := pending[id]; ok && after(s.id, id) {
				put(id, body)
				delete(pending, id)
			}
		}
		switch s.id {
		case 5:
			if _, ok := pending[5]; ok {
				put(5, appendEntries(s.body, 1, []byte{0x01, 0x00, 0x00}))
				delete(pending, 5)
			} else {
				put(5, s.body)
			}
		case 6:
			put(6, appendEntries(s.body, 2, globals))
		case 7:
			put(7, appendEntries(s.body, 1, export))
			delete(pending, 7)
		case 10:
			code, err := checkedCode(s.body, c)
			if err != nil {
				return nil, err
			}
			put(10, code)
		default:
			put(s.id, s.body)
		}
	}
	for _, id := range []byte{5, 6, 7} {
		if body, ok := pending[id]; ok {
			put(id, body)
		}
	}
	return out, nil
}

// checks are the instructions inserted, reading globals stop and countdown (the first indices past
// the module's own); noMemory is a module without a memory, given one of no pages for the tick.
type checks struct {
	stop, countdown uint32
	noMemory        bool
}

// entry is the check at a function's entry and a loop's start: the flag read (unreachable when
// set), the countdown moved, and at its end a tick.
func (c checks) entry() []byte {
	b := append(AppendU32([]byte{0x23}, c.stop), 0x04, 0x40, 0x00, 0x0b)  // global.get stop; if; unreachable; end
	b = append(AppendU32(append(b, 0x23), c.countdown), 0x41, 0x01, 0x6b) // global.get countdown; i32.const 1; i32.sub
	b = AppendU32(append(b, 0x24), c.countdown)                           // global.set countdown
	b = append(AppendU32(append(b, 0x23), c.countdown), 0x45, 0x04, 0x40) // global.get countdown; i32.eqz; if
	b = append(append(b, 0x41), appendS32(nil, tickEvery)...)             // i32.const tickEvery
	b = AppendU32(append(b, 0x24), c.countdown)                           // global.set countdown
	return append(append(b, c.tick()...), 0x0b)                           // tick; end
}

// refuse names an instruction (op, its immediates at r) that the module's own bytes make invalid
// and the bytes compiled would not: a global past the module's (the flag, the countdown), or the
// memory of a module that has none.
func (c checks) refuse(op byte, r reader) error {
	switch {
	case op == 0x23 || op == 0x24:
		if idx, err := r.u32(); err == nil && idx >= c.stop {
			return fmt.Errorf("global.get or global.set of global %d, which the module does not have", idx)
		}
	case !c.noMemory:
	case op >= 0x28 && op <= 0x40:
		return fmt.Errorf("the instruction 0x%02x uses a memory, which the module does not have", op)
	case op == 0xfc:
		if sub, err := r.u32(); err == nil && (sub == 8 || sub == 10 || sub == 11) {
			return fmt.Errorf("the instruction 0xfc %d uses a memory, which the module does not have", sub)
		}
	case op == 0xfd:
		if sub, err := r.byte(); err == nil && (sub <= 11 || sub >= 84 && sub <= 93) {
			return fmt.Errorf("the instruction 0xfd %d uses a memory, which the module does not have", sub)
		}
	}
	return nil
}

// refuseExports reads the export section: the module may not export a name of the host's
// (podium.stop), nor a global or a memory it does not have.
func refuseExports(body []byte, globals uint32, noMemory bool) error {
	if body == nil {
		return nil
	}
	return eachExport(&reader{b: body}, func(name string, kind byte, idx uint32) error {
		switch {
		case name == stopExport:
			return fmt.Errorf("the module exports %s itself, a name Podium keeps for its own", stopExport)
		case kind == 3 && idx >= globals:
			return fmt.Errorf("the module exports global %d, which it does not have", idx)
		case kind == 2 && noMemory:
			return fmt.Errorf("the module exports memory %d, which it does not have", idx)
		}
		return nil
	})
}

// hasActiveData reports whether a data section holds a segment written into a memory at
// instantiation (an active one); true too when it cannot be read (the compiler refuses it).
func hasActiveData(body []byte) bool {
	if body == nil {
		return false
	}
	r := &reader{b: body}
	n, err := r.u32()
	if err != nil {
		return true
	}
	for range n {
		flags, err := r.u32()
		if err != nil || flags != 1 {
			return true // 0 and 2: active; any other is not a segment
		}
		size, err := r.u32()
		if err != nil || r.skip(int(size)) != nil {
			return true
		}
	}
	return false
}

// appendS32 appends a signed LEB128 number.
func appendS32(b []byte, v int32) []byte {
	for {
		c := byte(v & 0x7f)
		v >>= 7
		if v == 0 && c&0x40 == 0 || v == -1 && c&0x40 != 0 {
			return append(b, c)
		}
		b = append(b, c|0x80)
	}
}

// tick leaves for Go and back: memory.grow by 0 pages, its result dropped.
func (c checks) tick() []byte { return []byte{0x41, 0x00, 0x40, 0x00, 0x1a} }

// sectionOrder is where each known section goes in a module (the binary format's order; custom
// sections, id 0, go anywhere).
var sectionOrder = map[byte]int{1: 1, 2: 2, 3: 3, 4: 4, 5: 5, 13: 6, 6: 7, 7: 8, 8: 9, 9: 10, 12: 11, 10: 12, 11: 13}

// after reports whether a section of id goes after one of id want.
func after(id, want byte) bool {
	o, ok := sectionOrder[id]
	return ok && o > sectionOrder[want]
}

// appendEntries is a vector section's body (a count, then its entries) with n entries appended.
func appendEntries(body []byte, n uint32, entries []byte) []byte {
	r := &reader{b: body}
	count, _ := r.u32() // read by eachSection's caller already
	out := AppendU32(make([]byte, 0, len(body)+len(entries)+5), count+n)
	out = append(out, body[r.pos:]...)
	return append(out, entries...)
}

// errUnreadable is code the instrumentation could not read to its end.
var errUnreadable = errors.New("its code could not be read to its end")

// checkedCode is the code section's body with c's checks inserted (see the top of this file).
func checkedCode(body []byte, c checks) ([]byte, error) {
	r := &reader{b: body}
	n, err := r.u32()
	if err != nil {
		return nil, fmt.Errorf("the code section: %w", errUnreadable)
	}
	out := AppendU32(make([]byte, 0, len(body)+len(body)/8), n)
	var fn []byte
	for i := range n {
		size, err := r.u32()
		if err != nil || r.pos+int(size) > len(body) {
			return nil, fmt.Errorf("function %d: %w", i, errUnreadable)
		}
		if fn, err = checkedBody(fn[:0], &reader{b: body[:r.pos+int(size)], pos: r.pos}, c); err != nil {
			return nil, fmt.Errorf("function %d: %w", i, err)
		}
		r.pos += int(size)
		out = AppendU32(out, uint32(len(fn)))
		out = append(out, fn...)
	}
	if r.pos != len(body) {
		return nil, fmt.Errorf("the code section: %w", errUnreadable)
	}
	return out, nil
}

// checkedBody appends to out one function body read from r (its locals, then its instructions to
// the end of r) with c's entry check after its locals and after every loop's block type, and a
// tick before every bulk memory instruction (which runs as long as the memory is large).
func checkedBody(out []byte, r *reader, c checks) ([]byte, error) {
	start := r.pos
	groups, err := r.u32()
	if err != nil {
		return nil, errUnreadable
	}
	for range groups { // a count and a value type each
		if _, err := r.u32(); err != nil {
			return nil, errUnreadable
		}
		if _, err := r.byte(); err != nil {
			return nil, errUnreadable
		}
	}
	entry, tick := c.entry(), c.tick()
	out = append(out, r.b[start:r.pos]...)
	out = append(out, entry...)
	from := r.pos
	for r.pos < len(r.b) {
		at := r.pos
		op, err := r.byte()
		if err != nil {
			return nil, errUnreadable
		}
		if err := c.refuse(op, *r); err != nil {
			return nil, err
		}
		if op == 0xfc {
			peek := *r
			if sub, err := peek.u32(); err == nil && (sub == 8 || sub == 10 || sub == 11) { // memory.init, .copy, .fill
				out = append(out, r.b[from:at]...)
				out = append(out, tick...)
				from = at
			}
		}
		known, err := skipInstruction(r, op)
		if err != nil {
			return nil, errUnreadable
		}
		if !known {
			return nil, fmt.Errorf("the instruction 0x%02x, which Podium does not read: a call could not be bounded", op)
		}
		if op == 0x03 { // loop: each iteration begins past its block type
			out = append(out, r.b[from:r.pos]...)
			out = append(out, entry...)
			from = r.pos
		}
	}
	return append(out, r.b[from:]...), nil
}

// skipInstruction skips the immediates of op, read just before: those skipImmediates knows, and
// the 0xfc (bulk memory, tables, saturating truncations) and 0xfd (SIMD) instructions; false for
// any other.
func skipInstruction(r *reader, op byte) (bool, error) {
	switch op {
	case 0xfc:
		sub, err := r.u32()
		if err != nil {
			return true, err
		}
		switch {
		case sub <= 7: // saturating truncations
			return true, nil
		case sub == 8, sub == 10, sub == 12, sub == 14: // memory.init, memory.copy, table.init, table.copy
			return true, r.skipU32s(2)
		case sub == 9, sub == 11, sub == 13, sub == 15, sub == 16, sub == 17: // data.drop, memory.fill, elem.drop, table.grow, .size, .fill
			return true, r.skipU32s(1)
		}
		return false, nil
	case 0xfd:
		// One byte, as wazero reads it (its validator and its compiler), not the LEB128 the
		// proposal says: read otherwise, 0xfd 0x8c 0x00 is for wazero an instruction and an
		// unreachable, for a LEB reader a v128.const whose 16 bytes would hide a loop from the
		// checks (a review found it).
		b, err := r.byte()
		if err != nil {
			return true, err
		}
		switch sub := uint32(b); {
		case sub <= 11, sub == 92, sub == 93: // loads and stores: a memory argument
			return true, r.skipMemarg()
		case sub == 12, sub == 13: // v128.const, i8x16.shuffle: 16 bytes
			return true, r.skip(16)
		case sub >= 21 && sub <= 34: // extract and replace lane: a lane
			return true, r.skip(1)
		case sub >= 84 && sub <= 91: // load and store lane: a memory argument, a lane
			if err := r.skipMemarg(); err != nil {
				return true, err
			}
			return true, r.skip(1)
		default: // the others take no immediate
			return true, nil
		}
	}
	return skipImmediates(r, op)
}

// skipMemarg skips a memory argument: an alignment (bit 6: a memory index follows) and an offset.
func (r *reader) skipMemarg() error {
	align, err := r.u32()
	if err != nil {
		return err
	}
	if align&0x40 != 0 {
		if err := r.skipU32s(1); err != nil {
			return err
		}
	}
	return r.skipU32s(1)
}

// armStop sets stop when ctx ends, so that the call running on its instance traps at its next
// check. disarm stops that, waiting for a Set under way: the global is not written after it
// returns (a reactor's instance is set back and reused after its call).
func armStop(ctx context.Context, stop api.MutableGlobal) (disarm func()) {
	stop.Set(0)
	done := make(chan struct{})
	stopAfter := context.AfterFunc(ctx, func() {
		defer close(done)
		stop.Set(1)
	})
	return func() {
		if !stopAfter() {
			<-done
		}
	}
}
