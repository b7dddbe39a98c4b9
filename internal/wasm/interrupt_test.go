package wasm_test

import (
	"bytes"
	"context"
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/tetratelabs/wazero"

	"github.com/podium-llm/podium/internal/panics"
	"github.com/podium-llm/podium/internal/testenv"
	"github.com/podium-llm/podium/internal/wasm"
)

// bodies is a code section's content: each body (its locals and instructions) with its size.
func bodies(code ...[]byte) []byte {
	out := testenv.U32(uint32(len(code)))
	for _, b := range code {
		out = append(append(out, testenv.U32(uint32(len(b)))...), b...)
	}
	return out
}

// module is a module of the sections given, in order.
func module(sections ...[]byte) []byte {
	m := []byte("\x00asm\x01\x00\x00\x00")
	for _, s := range sections {
		m = append(m, s...)
	}
	return m
}

var (
	// spinCommand's _start loops for ever, calling nothing: no host function, no other function.
	spinCommand = testenv.WasmCommand(testenv.NoLocals, []byte{0x03, 0x40, 0x0c, 0x00, 0x0b}, nil) // loop; br 0; end
	// forkCommand's _start calls f(60), which calls f(n-1) twice: 2^60 calls, and not a loop among
	// them; its stack is never deeper than 61 frames.
	forkCommand = module(
		testenv.Section(1, []byte{0x02, 0x60, 0x00, 0x00, 0x60, 0x01, 0x7e, 0x00}), // types: () -> (), (i64) -> ()
		testenv.Section(3, []byte{0x02, 0x00, 0x01}),
		testenv.Section(7, []byte{1, 6}, []byte("_start"), []byte{0, 0}),
		testenv.Section(10, bodies(
			[]byte{0x00, 0x42, 0x3c, 0x10, 0x01, 0x0b}, // f(60)
			[]byte{0x00,
				0x20, 0x00, 0x50, 0x04, 0x40, 0x0f, 0x0b, // if n == 0: return
				0x20, 0x00, 0x42, 0x01, 0x7d, 0x10, 0x01, // f(n-1)
				0x20, 0x00, 0x42, 0x01, 0x7d, 0x10, 0x01, // f(n-1)
				0x0b})),
	)
	// spinReactor's podium_run answers its first two calls (the warm-up's) at once, counting them
	// in a global, and loops for ever in every later one (each starts from the snapshot: two).
	spinReactor = module(
		testenv.Section(1, []byte{0x02, 0x60, 0x00, 0x00, 0x60, 0x00, 0x01, 0x7f}), // types: () -> (), () -> i32
		testenv.Section(3, []byte{0x02, 0x00, 0x01}),
		testenv.Section(5, []byte{0x01, 0x00, 0x01}),                   // a memory of one page
		testenv.Section(6, []byte{0x01, 0x7f, 0x01, 0x41, 0x00, 0x0b}), // a mutable i32, 0
		testenv.Section(7, []byte{3, 11}, []byte("_initialize"), []byte{0, 0, 10}, []byte("podium_run"), []byte{0, 1, 6}, []byte("memory"), []byte{2, 0}),
		testenv.Section(10, bodies([]byte{0x00, 0x0b}, []byte{0x00,
			0x23, 0x00, 0x41, 0x02, 0x49, 0x04, 0x40, // if calls < 2:
			0x23, 0x00, 0x41, 0x01, 0x6a, 0x24, 0x00, 0x41, 0x00, 0x0f, 0x0b, // calls++; return 0
			0x03, 0x40, 0x0c, 0x00, 0x0b, 0x41, 0x00, 0x0b})), // loop; br 0; end
	)
)

// TestCodeThatCallsNothingEndsAtTheDeadline: a builder whose code never returns to the host (a
// loop, or calls that are not a loop) is stopped when the call's context ends, by the checks the
// engine compiles into its code (interrupt.go), and the same instance (a reactor's) or the engine
// serves the next call.
func TestCodeThatCallsNothingEndsAtTheDeadline(t *testing.T) {
	e := engine(t)
	for _, c := range []struct {
		name   string
		module []byte
	}{{"a loop", spinCommand}, {"calls without a loop", forkCommand}, {"a reactor's loop", spinReactor}} {
		t.Run(c.name, func(t *testing.T) {
			m := load(t, e, c.module)
			for call := range 2 {
				ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
				start := time.Now()
				out, err := m.Run(ctx, []byte(buildInput), requestTime)
				cancel()
				var f *wasm.Failure
				if !errors.As(err, &f) || f.Reason != wasm.ReasonTimeout {
					t.Fatalf("call %d: %v (answer %q), want a timeout", call, err, out)
				}
				// Bounded work, not time: it ended, and long before a loop of 2^60 would.
				if took := time.Since(start); took > 30*time.Second {
					t.Fatalf("call %d ended after %s", call, took)
				}
			}
		})
	}
}

// TestTheWorldStopsWhileABuilderSpins: Go's runtime cannot preempt compiled WebAssembly, so a
// garbage collection waits until a builder's code returns to Go; code that returns only when the
// flag is set would wait for the collection, which waits for it. The code returns to Go every
// tickEvery checks: collections run while a builder spins (here, one after another), and its call
// still ends at its deadline. (With the flag alone, this test hung until the test binary's timeout.)
func TestTheWorldStopsWhileABuilderSpins(t *testing.T) {
	e := engine(t)
	for _, c := range []struct {
		name   string
		module []byte
	}{{"a command", spinCommand}, {"a reactor", spinReactor}} {
		t.Run(c.name, func(t *testing.T) {
			m := load(t, e, c.module)
			done := make(chan struct{})
			collected := make(chan int)
			go func() {
				n := 0
				for {
					select {
					case <-done:
						collected <- n
						return
					default:
						runtime.GC()
						n++
					}
				}
			}()
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			_, err := m.Run(ctx, []byte(buildInput), requestTime)
			cancel()
			close(done)
			n := <-collected
			var f *wasm.Failure
			if !errors.As(err, &f) || f.Reason != wasm.ReasonTimeout {
				t.Fatalf("%v, want a timeout", err)
			}
			if n == 0 {
				t.Fatal("no collection finished while the builder ran")
			}
			t.Logf("%d collections while the builder spun", n)
		})
	}
}

// TestAStartSectionIsRefused: a start section's function runs as the module is instantiated,
// before the host could arm the flag its checks read; it would loop for ever unchecked.
func TestAStartSectionIsRefused(t *testing.T) {
	spinAtStart := testenv.WasmCommand(testenv.NoLocals, []byte{0x03, 0x40, 0x0c, 0x00, 0x0b}, map[byte][]byte{8: testenv.Section(8, []byte{0})}) // start: function 0, a loop
	_, err := engine(t).Load(context.Background(), spinAtStart)
	var f *wasm.Failure
	if !errors.As(err, &f) || f.Reason != wasm.ReasonLoad || !strings.Contains(f.Detail, "start section") {
		t.Fatalf("a module that loops in its start section: %v", err)
	}
}

// TestCodeTheHostCannotReadIsRefused: a module using an instruction the instrumentation does not
// read (an atomic, of the threads proposal) could not be bounded: refused at load, naming it.
func TestCodeTheHostCannotReadIsRefused(t *testing.T) {
	atomic := testenv.WasmCommand(testenv.NoLocals, []byte{0xfe, 0x03, 0x00}, map[byte][]byte{5: testenv.Section(5, []byte{1, 0, 1})}) // atomic.fence
	_, err := engine(t).Load(context.Background(), atomic)
	var f *wasm.Failure
	if !errors.As(err, &f) || f.Reason != wasm.ReasonLoad || !strings.Contains(f.Detail, "0xfe") {
		t.Fatalf("a module with an atomic: %v", err)
	}
}

// FuzzInterruptible: whatever bytes it is given (read as the engine reads them: within the
// budget, of a kind), the instrumentation does not panic, and the bytes compiled are valid exactly
// when the module's are (a module invalid in its own bytes, valid in the bytes compiled, could
// reach what the host added: code that wrote the flag would escape the deadline), and export the
// flag.
func FuzzInterruptible(f *testing.F) {
	for _, m := range [][]byte{spinCommand, forkCommand, spinReactor, trapModule, trapReactor, tableSetReactor, hiddenLoop, clearingCommand(10)} {
		f.Add(m)
	}
	rt := wazero.NewRuntime(context.Background())
	f.Cleanup(func() { rt.Close(context.Background()) })
	compiles := func(m []byte) bool {
		var c wazero.CompiledModule
		var err error
		if p := panics.Catch(func() { c, err = rt.CompileModule(context.Background(), m) }); p != nil || err != nil {
			return false
		}
		c.Close(context.Background())
		return true
	}
	f.Fuzz(func(t *testing.T, module []byte) {
		module, err := wasm.DefaultBudget.Bound(module)
		if err != nil {
			return
		}
		if _, module, _, err = wasm.KindOf(module); err != nil {
			return
		}
		out, err := wasm.Interruptible(module)
		if err != nil {
			return // refused at load
		}
		before, after := compiles(module), compiles(out)
		switch {
		case before && !after:
			t.Fatal("the module compiles, with the checks it does not")
		case !before && after:
			t.Fatal("the module does not compile, with the checks it does")
		case after && !bytes.Contains(out, []byte("podium.stop")):
			t.Fatal("the flag is not exported")
		}
	})
}

// hiddenLoop is, for wazero, a block left at once, an instruction and an unreachable in it, then a
// loop; read with a SIMD sub-opcode as a LEB128 (0xfd 0x8c 0x00: v128.const), its 16 bytes would
// hide the loop from the checks (a review found it).
var hiddenLoop = testenv.WasmCommand(testenv.NoLocals, []byte{
	0x02, 0x40, 0x0c, 0x00, // block; br 0
	0xfd, 0x8c, 0x00, // i16x8.shr_s; unreachable
	0x0b,                         // end
	0x03, 0x40, 0x0c, 0x00, 0x0b, // loop; br 0; end
	0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, 0x01, // nop
}, map[byte][]byte{5: testenv.Section(5, []byte{0x01, 0x00, 0x01})})

// clearingCommand has no global: in its own bytes its code's globals 0 and 1 are invalid, in the
// bytes compiled they would be the flag and the countdown. Each iteration of its loop does work
// long straight work, then clears the flag and sets the countdown back (a review found it).
func clearingCommand(work int) []byte {
	code := []byte{0x03, 0x40} // loop
	for range work {
		code = append(code, 0x01) // nop
	}
	code = append(code, 0x41, 0x00, 0x24, 0x00, 0x41, 0x10, 0x24, 0x01, 0x0c, 0x00, 0x0b) // global.set 0 (0); global.set 1 (16); br 0; end
	return testenv.WasmCommand(testenv.NoLocals, code, nil)
}

// TestTheBytesCompiledAreValidWhenTheModulesAre: what a review found the instrumentation read
// otherwise than wazero, or made valid where the module's own bytes are not: each refused at load,
// naming why, or loaded and bounded; and empty sections are taken as they are.
func TestTheBytesCompiledAreValidWhenTheModulesAre(t *testing.T) {
	e := engine(t)
	for _, c := range []struct {
		name, refused string // "": it loads
		module        []byte
	}{
		{"code writing globals it does not have (the flag, the countdown)", "global.get or global.set of global 0, which the module does not have", clearingCommand(3000)},
		{"memory.size without a memory", "uses a memory, which the module does not have", testenv.WasmCommand(testenv.NoLocals, []byte{0x3f, 0x00, 0x1a}, nil)},
		{"a data segment without a memory", "data segments into a memory it does not have", testenv.WasmCommand(testenv.NoLocals, nil, map[byte][]byte{11: testenv.Section(11, []byte{0x01, 0x00, 0x41, 0x00, 0x0b, 0x00})})},
		{"an export of a global it does not have", "exports global 0, which it does not have", testenv.WasmCommand(testenv.NoLocals, nil, map[byte][]byte{7: testenv.Section(7, []byte{2, 6}, []byte("_start"), []byte{0, 0, 1}, []byte("g"), []byte{3, 0})})},
		{"an export named podium.stop", "exports podium.stop itself", testenv.WasmCommand(testenv.NoLocals, nil, map[byte][]byte{7: testenv.Section(7, []byte{2, 6}, []byte("_start"), []byte{0, 0, 11}, []byte("podium.stop"), []byte{0, 0})})},
		{"an empty memory section", "", testenv.WasmCommand(testenv.NoLocals, nil, map[byte][]byte{5: testenv.Section(5, []byte{0})})},
		{"an empty global section", "", testenv.WasmCommand(testenv.NoLocals, nil, map[byte][]byte{6: testenv.Section(6, []byte{0})})},
		{"a loop after a SIMD instruction read as wazero reads it", "", hiddenLoop},
	} {
		t.Run(c.name, func(t *testing.T) {
			m, err := e.Load(context.Background(), c.module)
			if c.refused != "" {
				var f *wasm.Failure
				if !errors.As(err, &f) || f.Reason != wasm.ReasonLoad || !strings.Contains(f.Detail, c.refused) {
					t.Fatalf("%v, want a load failure saying %q", err, c.refused)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			if _, err := m.Run(ctx, []byte(buildInput), requestTime); err != nil && !strings.Contains(err.Error(), "deadline") {
				t.Fatalf("a call: %v", err)
			}
		})
	}
}

// TestModulesTheCompilerCannotTakeAreRefused: two modules FuzzInterruptible found that wazero
// cannot take: one whose code section declares a billion bodies and ends (the compiler makes room
// for them all: on the code before, the process died of out of memory), and a function of a type
// past the module's (its validator panics). The engine refuses both, and goes on.
func TestModulesTheCompilerCannotTakeAreRefused(t *testing.T) {
	e := engine(t)
	billion := []byte("\x00asm\x01\x00\x00\x00\x01\x04\x01\x60\x00\x00\x03\x02\x01\x00\x07\x0a\x01\x06_start\x00\x00\n0\x80\xff\xff\xff\x03\x0000")
	_, err := e.Load(context.Background(), billion)
	var f *wasm.Failure
	if !errors.As(err, &f) || f.Reason != wasm.ReasonLoad || !strings.Contains(f.Detail, "runs past the module's end") {
		t.Fatalf("a code section of a billion bodies that ends at once: %v", err)
	}
	m := module( // function 0 calls function 1, of type 48: there are 2
		testenv.Section(1, []byte{0x02, 0x60, 0x00, 0x00, 0x60, 0x01, 0x7e, 0x00}),
		testenv.Section(3, []byte{0x02, 0x00, 0x30}),
		testenv.Section(7, []byte{1, 6}, []byte("_start"), []byte{0, 0}),
		testenv.Section(10, bodies([]byte{0x00, 0x41, 0x30, 0x10, 0x01, 0x0b}, []byte{0x00, 0x0b})), // 0 calls 1
	)
	_, err = e.Load(context.Background(), m)
	if !errors.As(err, &f) || f.Reason != wasm.ReasonLoad || !strings.Contains(f.Detail, "the compiler failed") {
		t.Fatalf("a module wazero's validator panics on: %v", err)
	}
	if _, err := e.Load(context.Background(), spinCommand); err != nil {
		t.Fatalf("the engine no longer loads a module: %v", err)
	}
}
