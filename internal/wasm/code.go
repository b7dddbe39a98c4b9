package wasm

import "fmt"

// A reactor's calls start from its snapshot: memory and mutable globals set back (reactor.go).
// What else an instance holds, its tables and which of its segments were dropped, cannot be set
// back through wazero: a reactor whose code could change them (table.set, table.grow, table.fill,
// table.copy, table.init, elem.drop, data.drop) would carry a call's state into the next. Such a
// module is refused as a reactor at load, naming the instruction; it may still be built as a
// command. So is a reactor whose code uses an instruction this reader does not know (SIMD,
// threads, other proposals): what it does to an instance cannot be told. Go's, clang's and
// rustc's reactors use none of these.

// refuseStatefulCode reads every function body of the code section of wasm and names the first
// instruction a reactor may not use; nil when there is none.
func refuseStatefulCode(wasm []byte) error {
	return eachSection(wasm, func(id byte, sec *reader) error {
		if id == 10 {
			if err := refuseInBodies(sec); err != nil {
				return err
			}
			return errStop
		}
		return nil
	})
}

func refuseInBodies(r *reader) error {
	n, err := r.u32()
	if err != nil {
		return nil
	}
	for i := range n {
		size, err := r.u32()
		if err != nil || r.pos+int(size) > len(r.b) {
			return nil
		}
		body := &reader{b: r.b[:r.pos+int(size)], pos: r.pos}
		r.pos += int(size)
		groups, err := body.u32()
		if err != nil {
			return nil
		}
		for range groups { // the locals: a count and a value type each
			if _, err := body.u32(); err != nil {
				return nil
			}
			if _, err := body.byte(); err != nil {
				return nil
			}
		}
		if err := refuseInstructions(body); err != nil {
			return fmt.Errorf("function %d: %w", i, err)
		}
	}
	return nil
}

// statefulFC names the 0xfc instruction sub, when it changes an instance's tables or segments.
func statefulFC(sub uint32) (string, bool) {
	switch sub {
	case 9:
		return "data.drop", true
	case 12:
		return "table.init", true
	case 13:
		return "elem.drop", true
	case 14:
		return "table.copy", true
	case 15:
		return "table.grow", true
	case 17:
		return "table.fill", true
	}
	return "", false
}

// refuseInstructions reads instructions to the end of r.
func refuseInstructions(r *reader) error {
	for r.pos < len(r.b) {
		op, err := r.byte()
		if err != nil {
			return nil
		}
		switch {
		case op == 0x26:
			return fmt.Errorf("table.set changes a table, which a reactor's snapshot cannot set back")
		case op == 0xfc:
			peek := *r
			sub, err := peek.u32()
			if err != nil {
				return nil
			}
			if name, ok := statefulFC(sub); ok {
				return fmt.Errorf("%s changes the instance's tables or segments, which a reactor's snapshot cannot set back", name)
			}
			known, err := skipInstruction(r, op) // its immediates, as the instrumentation reads them
			if err != nil {
				return nil
			}
			if !known {
				return fmt.Errorf("the instruction 0xfc %d, which Podium does not read", sub)
			}
		default:
			known, err := skipImmediates(r, op)
			if err != nil {
				return nil // a body that ends early: the compiler says so
			}
			if !known {
				return fmt.Errorf("the instruction 0x%02x, which Podium does not read", op)
			}
		}
	}
	return nil
}

// skipImmediates skips what follows opcode op (one of the core instructions and their
// sign-extension, reference, tail-call and exception additions); false for any other opcode.
func skipImmediates(r *reader, op byte) (bool, error) {
	switch {
	case op == 0x00, op == 0x01, op == 0x05, op == 0x0b, op == 0x0f, op == 0x19, op == 0x1a, op == 0x1b, op == 0xd1,
		op >= 0x45 && op <= 0xc4: // no immediate
		return true, nil
	case op == 0x02, op == 0x03, op == 0x04, op == 0x06: // block, loop, if, try: a block type
		return true, r.skipLEB()
	case op == 0x07, op == 0x08, op == 0x09, op == 0x0c, op == 0x0d, op == 0x10, op == 0x12, op == 0x18,
		op >= 0x20 && op <= 0x25, op == 0xd2: // an index
		return true, r.skipU32s(1)
	case op == 0x11, op == 0x13: // call_indirect: a type, a table
		return true, r.skipU32s(2)
	case op == 0x0e: // br_table: labels, and the default
		n, err := r.u32()
		if err != nil {
			return true, err
		}
		return true, r.skipU32s(int(n) + 1)
	case op == 0x1c: // select with types
		n, err := r.u32()
		if err != nil {
			return true, err
		}
		return true, r.skip(int(n))
	case op >= 0x28 && op <= 0x3e: // loads and stores: alignment (bit 6: a memory follows), offset
		align, err := r.u32()
		if err != nil {
			return true, err
		}
		if align&0x40 != 0 {
			if err := r.skipU32s(1); err != nil {
				return true, err
			}
		}
		return true, r.skipU32s(1)
	case op == 0x3f, op == 0x40: // memory.size, memory.grow: a memory
		return true, r.skipU32s(1)
	case op == 0x41, op == 0x42: // i32.const, i64.const
		return true, r.skipLEB()
	case op == 0x43:
		return true, r.skip(4)
	case op == 0x44:
		return true, r.skip(8)
	case op == 0xd0: // ref.null: a reference type
		_, err := r.byte()
		return true, err
	}
	return false, nil
}

func (r *reader) skipU32s(n int) error {
	for range n {
		if _, err := r.u32(); err != nil {
			return err
		}
	}
	return nil
}
