package wasm

import (
	"errors"
	"fmt"
	"slices"
)

// What a module makes its host allocate besides linear memory (which Limits.MemoryPages bounds):
// tables (8 bytes a slot in wazero, and table.grow runs in the host, outside every memory limit and
// uninterrupted by the deadline), globals, element and data segments, function locals (a frame's
// slots), functions (compile cost). Each is checked where the module declares it, before wazero
// compiles anything, and refused naming the limit (docs/security.md). At run time the only growth
// left is table.grow, which wazero stops at the table's declared maximum: a table that declares none
// (Go's and clang's modules do not) is given the rest of the budget as its maximum, by rewriting the
// table section of the bytes compiled (the module keeps its identity, the sha256 of its own bytes),
// so growth stays within the budget whatever the module asks. The call stack is wazero's own ceiling (Limits.Concurrent says
// more); the module's size is bounded where it is read (builders.MaxModuleBytes).

// Budget bounds a module's declarations.
type Budget struct {
	TableSlots        uint64 // every table's declared maximum, summed (8 bytes of host memory a slot)
	Tables            int
	Globals           int
	Functions         int
	LocalsPerFunction uint64
	Segments          int // element and data segments, each
}

// DefaultBudget is far above what Go (GOOS=wasip1), C (clang, wasi-libc) and Rust builders declare
// (the example Go builder: one table of about 2,000 slots, 4,000 functions, a few dozen locals a
// function) and far below what hurts a host: 8 MiB of tables at most.
var DefaultBudget = Budget{TableSlots: 1 << 20, Tables: 16, Globals: 1 << 16, Functions: 1 << 20, LocalsPerFunction: 1 << 16, Segments: 1 << 16}

// errTruncated is a module whose bytes end inside a declaration.
var errTruncated = errors.New("the module ends inside a section")

// Bound reads the declarations of a module's binary and says which one is over the budget; it
// returns the bytes to compile: the module's, with a maximum given to every table that declares
// none. A module it cannot read is left to wazero's compiler, which says why.
func (b Budget) Bound(wasm []byte) ([]byte, error) {
	var unbounded []tableDecl
	tablesAt, tablesEnd := -1, -1
	if err := b.check(wasm, &unbounded, &tablesAt, &tablesEnd); err != nil {
		return nil, err
	}
	if !slices.ContainsFunc(unbounded, func(d tableDecl) bool { return !d.hasMax }) {
		return wasm, nil // every table declares its maximum: nothing to write again
	}
	return b.boundTables(wasm, unbounded, tablesAt, tablesEnd)
}

// tableDecl is a table of the table section as declared.
type tableDecl struct {
	ref      byte
	min, max uint32
	hasMax   bool
}

func (b Budget) check(wasm []byte, decls *[]tableDecl, tablesAt, tablesEnd *int) error {
	var r *reader // the section being read (its closures read through it)
	var tableSlots uint64
	tables := 0
	table := func(where string, declared bool) error {
		ref, err := r.byte() // the reference type
		if err != nil {
			return err
		}
		// funcref or externref only: a typed reference (0x63, 0x64 and a heap type) or a table with
		// an initializer (0x40) would be read as other limits than wazero reads.
		if ref != 0x70 && ref != 0x6f {
			return fmt.Errorf("%s is not a table of funcref or externref (type 0x%02x)", where, ref)
		}
		flags, err := r.u32()
		if err != nil {
			return err
		}
		if flags > 1 {
			return fmt.Errorf("%s is not a table of 32-bit size", where)
		}
		min, err := r.u32()
		if err != nil {
			return err
		}
		max := min
		if flags&1 != 0 {
			if max, err = r.u32(); err != nil {
				return err
			}
		} else if !declared {
			return fmt.Errorf("%s declares no maximum size: an imported table must declare one", where)
		}
		if declared {
			*decls = append(*decls, tableDecl{ref: ref, min: min, max: max, hasMax: flags&1 != 0})
		}
		tables++
		tableSlots += uint64(max)
		if tables > b.Tables {
			return fmt.Errorf("the module declares more than %d tables", b.Tables)
		}
		if tableSlots > b.TableSlots {
			return fmt.Errorf("%s declares a maximum of %d slots: the module's tables would hold more than %d slots", where, max, b.TableSlots)
		}
		return nil
	}
	count := func(what string, limit int) (int, error) {
		n, err := r.u32()
		if err != nil {
			return 0, err
		}
		if uint64(n) > uint64(limit) {
			return 0, fmt.Errorf("the module declares %d %s, over %d", n, what, limit)
		}
		return int(n), nil
	}
	return eachSection(wasm, func(id byte, sec *reader) error {
		r = sec
		end := len(sec.b)
		switch id {
		case 2: // imports
			n, err := count("imports", b.Functions+b.Tables+b.Globals+1)
			if err != nil {
				return err
			}
			for i := range n {
				if err := r.skipName(); err != nil {
					return errStop
				}
				if err := r.skipName(); err != nil {
					return errStop
				}
				kind, err := r.byte()
				if err != nil {
					return errStop
				}
				switch kind {
				case 0: // a function: its type
					_, err = r.u32()
				case 1:
					if err := table(fmt.Sprintf("imported table %d", i), false); err != nil {
						return lenient(err)
					}
				case 2: // a memory: bounded by Limits.MemoryPages
					var flags uint32
					if flags, err = r.u32(); err == nil {
						if _, err = r.u32(); err == nil && flags&1 != 0 {
							_, err = r.u32()
						}
					}
				case 3: // a global: its type and mutability
					if _, err = r.byte(); err == nil {
						_, err = r.byte()
					}
				default:
					return errStop // the compiler says what it is
				}
				if err != nil {
					return errStop
				}
			}
		case 3:
			if _, err := count("functions", b.Functions); err != nil {
				return err
			}
		case 4: // tables
			*tablesAt, *tablesEnd = r.pos, end
			n, err := count("tables", b.Tables)
			if err != nil {
				return lenient(err)
			}
			for i := range n {
				if err := table(fmt.Sprintf("table %d", i), true); err != nil {
					return lenient(err)
				}
			}
			if r.pos != end {
				return fmt.Errorf("the table section holds more than its tables")
			}
		case 6:
			if _, err := count("globals", b.Globals); err != nil {
				return err
			}
		case 9:
			if _, err := count("element segments", b.Segments); err != nil {
				return err
			}
		case 11:
			if _, err := count("data segments", b.Segments); err != nil {
				return err
			}
		case 10: // code: each function's locals
			n, err := count("function bodies", b.Functions)
			if err != nil {
				return err
			}
			for i := range n {
				bodySize, err := r.u32()
				if err != nil || uint64(r.pos)+uint64(bodySize) > uint64(end) {
					return errStop // a body past its section: the compiler says so
				}
				next := r.pos + int(bodySize)
				body := &reader{b: wasm[:next], pos: r.pos} // its locals are read within the body only
				groups, err := body.u32()
				if err != nil {
					return errStop
				}
				var locals uint64
				for range groups {
					k, err := body.u32()
					if err != nil {
						return errStop
					}
					t, err := body.byte()
					if err != nil {
						return errStop
					}
					if t == 0x63 || t == 0x64 { // a typed reference: a heap type follows, read otherwise
						return fmt.Errorf("function %d declares a local of a typed reference, which a builder may not", i)
					}
					if locals += uint64(k); locals > b.LocalsPerFunction {
						return fmt.Errorf("function %d declares more than %d locals", i, b.LocalsPerFunction)
					}
				}
				r.pos = next
			}
		}
		return nil
	})
}

// boundTables writes the table section again, every table that declared no maximum given the slots
// the budget leaves (the others' maxima and minima counted first), and splices it in.
func (b Budget) boundTables(wasm []byte, decls []tableDecl, at, end int) ([]byte, error) {
	var fixed uint64 // slots of the tables with a maximum, and the minima of the others
	free := 0
	for _, d := range decls {
		fixed += uint64(d.max)
		if !d.hasMax {
			free++
		}
	}
	// Each table without a maximum may grow by an equal share of what is left.
	share := (b.TableSlots - min(fixed, b.TableSlots)) / uint64(max(free, 1))
	var body []byte
	body = AppendU32(body, uint32(len(decls)))
	for _, d := range decls {
		max := d.max
		if !d.hasMax {
			max = uint32(min(uint64(d.min)+share, 1<<32-1))
		}
		body = append(body, d.ref, 1)
		body = AppendU32(AppendU32(body, d.min), max)
	}
	return splice(wasm, 4, at, end, body), nil
}

// appendU32 appends an unsigned LEB128 number.
func AppendU32(b []byte, v uint32) []byte {
	for {
		c := byte(v & 0x7f)
		if v >>= 7; v != 0 {
			b = append(b, c|0x80)
			continue
		}
		return append(b, c)
	}
}

// errStop ends a walk of the sections (eachSection) without an error: what follows is left to
// the compiler.
var errStop = errors.New("wasm: stop reading")

// eachSection calls fn with each section's id and a reader over its body (positions are the
// module's; its bytes end where the section does), in order. Bytes that are not a module end the
// walk without an error: the compiler says what is wrong. A section whose size runs past the
// module's bytes is an error, never left to the compiler: wazero reads a code section's count of
// bodies before its size, and makes room for them all (37 bytes declaring a billion bodies made
// the process die of Go's out of memory, which nothing recovers). fn's errStop ends the walk; any
// other error is returned.
func eachSection(wasm []byte, fn func(id byte, sec *reader) error) error {
	if len(wasm) < 8 || string(wasm[:4]) != "\x00asm" {
		return nil
	}
	r := &reader{b: wasm, pos: 8}
	for r.pos < len(wasm) {
		id, _ := r.byte()
		size, err := r.u32()
		if err != nil || uint64(r.pos)+uint64(size) > uint64(len(wasm)) {
			return fmt.Errorf("section %d runs past the module's end (%d bytes)", id, len(wasm))
		}
		end := r.pos + int(size)
		if err := fn(id, &reader{b: wasm[:end], pos: r.pos}); err != nil {
			if errors.Is(err, errStop) {
				return nil
			}
			return err
		}
		r.pos = end
	}
	return nil
}

// lenient keeps a budget's refusal and turns a reading error into the walk's end: a module whose
// bytes end early is the compiler's to refuse.
func lenient(err error) error {
	if errors.Is(err, errTruncated) {
		return errStop
	}
	return err
}

// reader reads the binary format's bytes and LEB128 numbers.
type reader struct {
	b   []byte
	pos int
}

func (r *reader) byte() (byte, error) {
	if r.pos >= len(r.b) {
		return 0, errTruncated
	}
	c := r.b[r.pos]
	r.pos++
	return c, nil
}

// u32 reads an unsigned LEB128 number of at most 5 bytes.
func (r *reader) u32() (uint32, error) {
	var v uint64
	for shift := 0; shift < 35; shift += 7 {
		c, err := r.byte()
		if err != nil {
			return 0, err
		}
		v |= uint64(c&0x7f) << shift
		if c&0x80 == 0 {
			if v > 1<<32-1 {
				return 0, errTruncated
			}
			return uint32(v), nil
		}
	}
	return 0, errTruncated
}

// skipName skips a name (a length and its bytes).
func (r *reader) skipName() error {
	n, err := r.u32()
	if err != nil {
		return err
	}
	if r.pos+int(n) > len(r.b) {
		return errTruncated
	}
	r.pos += int(n)
	return nil
}
