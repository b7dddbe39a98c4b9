package wasm_test

import (
	"bytes"
	"context"
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/podium-llm/podium/internal/testenv"
	"github.com/podium-llm/podium/internal/wasm"
)

// TestModuleDeclarationsWithinBudget: each resource a module can make its host allocate besides
// linear memory is refused at load naming its limit when declared over the budget; a table that
// declares no maximum gets the budget's, so growing it by 2^28 slots (2 GiB of host memory before)
// fails inside the module instead, in little host memory and time.
func TestModuleDeclarationsWithinBudget(t *testing.T) {
	e := engine(t)
	b := wasm.DefaultBudget
	table := func(flags byte, min, max uint32) []byte { return testenv.WasmTable(min, max, flags == 1) }
	command, section, u32, noLocals, grow := testenv.WasmCommand, testenv.Section, testenv.U32, testenv.NoLocals, testenv.TableGrow
	many := func(n uint32, item []byte) []byte {
		out := u32(n)
		for range n {
			out = append(out, item...)
		}
		return out
	}
	for _, c := range []struct {
		name   string
		module []byte
		want   string
	}{
		{"a table's maximum over the budget", command(noLocals, nil, map[byte][]byte{4: section(4, []byte{1}, table(1, 0, 1<<28))}),
			"table 0 declares a maximum of 268435456 slots: the module's tables would hold more than 1048576 slots"},
		{"tables whose maxima add up over the budget", command(noLocals, nil, map[byte][]byte{4: section(4, []byte{2}, table(1, 0, 1<<19), table(1, 0, 1<<19+1))}),
			"table 1 declares a maximum of 524289 slots: the module's tables would hold more than 1048576 slots"},
		{"too many tables", command(noLocals, nil, map[byte][]byte{4: section(4, many(uint32(b.Tables+1), table(1, 0, 1)))}),
			"the module declares 17 tables, over 16"},
		{"too many globals", command(noLocals, nil, map[byte][]byte{6: section(6, many(uint32(b.Globals+1), []byte{0x7f, 0, 0x41, 0, 0x0b}))}),
			"the module declares 65537 globals, over 65536"},
		{"too many element segments", command(noLocals, nil, map[byte][]byte{9: section(9, u32(uint32(b.Segments+1)))}),
			"the module declares 65537 element segments, over 65536"},
		{"too many data segments", command(noLocals, nil, map[byte][]byte{11: section(11, u32(uint32(b.Segments+1)))}),
			"the module declares 65537 data segments, over 65536"},
		{"too many functions", command(noLocals, nil, map[byte][]byte{3: section(3, u32(uint32(b.Functions+1)))}),
			"the module declares 1048577 functions, over 1048576"},
		{"too many locals", command(append(u32(2), append(append(u32(1<<15), 0x7f), append(u32(1<<15+1), 0x7e)...)...), nil, nil),
			"function 0 declares more than 65536 locals"},
		{"a table of a typed reference", command(noLocals, nil, map[byte][]byte{4: section(4, []byte{1, 0x63, 0x70, 0, 0})}),
			"table 0 is not a table of funcref or externref (type 0x63)"},
		{"a local of a typed reference", command(append(u32(2), append([]byte{1, 0x63, 0}, append(u32(1<<30), 0x7f)...)...), nil, nil),
			"function 0 declares a local of a typed reference, which a builder may not"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := e.Load(context.Background(), c.module)
			var f *wasm.Failure
			if !errors.As(err, &f) || f.Reason != wasm.ReasonLoad || f.Detail != c.want {
				t.Errorf("load: %v, want a load failure saying %q", err, c.want)
			}
		})
	}

	// Growth: a table without a maximum, grown by 2^28 slots, then by a little.
	for _, c := range []struct {
		name  string
		delta int32
	}{{"2^28 slots", 1 << 28}, {"the whole budget and one", 1<<20 + 1}, {"within the budget", 1000}} {
		t.Run("table.grow by "+c.name, func(t *testing.T) {
			m := load(t, e, command(noLocals, grow(c.delta), map[byte][]byte{4: section(4, []byte{1}, table(0, 0, 0))}))
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			out, err := m.Run(ctx, []byte("{}"), requestTime)
			runtime.ReadMemStats(&after)
			// table.grow past the maximum answers -1 inside the module, which runs to its end.
			if err != nil || len(out) != 0 {
				t.Errorf("run: %v %q, want the module to end with nothing written", err, out)
			}
			// 8 bytes a slot: the budget's 2^20 slots are 8 MiB; 2^28 would be 2 GiB.
			if grown := after.TotalAlloc - before.TotalAlloc; grown > 64<<20 {
				t.Errorf("one run allocated %d MiB in the host, over 64", grown>>20)
			}
		})
	}
	// Tables that all declare a maximum within the budget: loaded as they are.
	if _, err := e.Load(context.Background(), command(noLocals, nil, map[byte][]byte{4: section(4, []byte{2}, table(1, 1, 1), table(1, 0, 8))})); err != nil {
		t.Errorf("tables with their maxima: %v", err)
	}
	// The module's own bytes keep their identity: the bounded copy is what is compiled, not what
	// is named.
	module := command(noLocals, nil, map[byte][]byte{4: section(4, []byte{1}, table(0, 5, 0))})
	if m := load(t, e, module); m.SHA256 != wasm.SHA256(module) {
		t.Errorf("the module is named %s, its bytes are %s", m.SHA256, wasm.SHA256(module))
	}
	if bounded, err := wasm.DefaultBudget.Bound(module); err != nil || strings.Contains(string(bounded), string(module[8:])) {
		t.Errorf("Bound: %v; the table section was not written again", err)
	}
}

// FuzzBound: no bytes make the budget's reading of a module panic, and what it returns to compile
// is either the module or the module with its table section written again.
func FuzzBound(f *testing.F) {
	f.Add(testenv.WasmCommand(testenv.NoLocals, testenv.TableGrow(5), map[byte][]byte{4: testenv.Section(4, []byte{1}, testenv.WasmTable(0, 0, false))}))
	f.Add(testenv.WasmCommand(testenv.NoLocals, nil, map[byte][]byte{4: testenv.Section(4, []byte{2}, testenv.WasmTable(1, 1, true), testenv.WasmTable(0, 4, true))}))
	f.Add([]byte("\x00asm\x01\x00\x00\x00\x04\x04\x01\x70\x01\x00"))
	f.Fuzz(func(t *testing.T, module []byte) {
		out, err := wasm.DefaultBudget.Bound(module)
		if err == nil && len(out) == 0 && len(module) > 0 {
			t.Errorf("Bound returned nothing for %d bytes", len(module))
		}
	})
}

// FuzzKindOf: reading a module's kind, and rewriting a reactor's exports, never panics whatever
// the bytes, and a reactor's bytes compiled hold every export added.
func FuzzKindOf(f *testing.F) {
	f.Add(trapReactor)
	f.Add(tableSetReactor)
	f.Add(trapModule)
	f.Fuzz(func(t *testing.T, module []byte) {
		kind, out, globals, err := wasm.KindOf(module)
		if err == nil && kind == wasm.KindReactor {
			for _, g := range globals {
				if !bytes.Contains(out, []byte(g)) {
					t.Errorf("the export %s is not in the bytes compiled", g)
				}
			}
		}
	})
}
