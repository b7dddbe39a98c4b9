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

// FuzzInterruptible: whatever bytes it is given (within the budget, as the engine reads them), the
// instrumentation does not panic, and a module wazero compiles still compiles with the checks in
// it, and exports the flag they read.
func FuzzInterruptible(f *testing.F) {
	for _, m := range [][]byte{spinCommand, forkCommand, spinReactor, trapModule, trapReactor, tableSetReactor} {
		f.Add(m)
	}
	rt := wazero.NewRuntime(context.Background())
	f.Cleanup(func() { rt.Close(context.Background()) })
	f.Fuzz(func(t *testing.T, module []byte) {
		module, err := wasm.DefaultBudget.Bound(module) // as the engine reads it: within the budget
		if err != nil {
			return
		}
		out, err := wasm.Interruptible(module)
		if err != nil {
			return // refused at load
		}
		var c wazero.CompiledModule
		if p := panics.Catch(func() { c, err = rt.CompileModule(context.Background(), module) }); p != nil || err != nil {
			return // the compiler refuses it as it is (or panics on it: the engine catches that)
		}
		c.Close(context.Background())
		checked, err := rt.CompileModule(context.Background(), out)
		if err != nil {
			t.Fatalf("the module compiles, with the checks it does not: %v", err)
		}
		checked.Close(context.Background())
		if !bytes.Contains(out, []byte("podium.stop")) {
			t.Fatal("the flag is not exported")
		}
	})
}

// TestModulesTheCompilerCannotTakeAreRefused: two modules FuzzInterruptible found that wazero
// cannot take: one whose code section declares a billion bodies and ends (the compiler makes room
// for them all: on the code before, the process died of out of memory), and a call to a function
// index past the module's (its validator panics). The engine refuses both, and goes on.
func TestModulesTheCompilerCannotTakeAreRefused(t *testing.T) {
	e := engine(t)
	billion := []byte("\x00asm\x01\x00\x00\x00\x01\x04\x01\x60\x00\x00\x03\x02\x01\x00\x07\x0a\x01\x06_start\x00\x00\n0\x80\xff\xff\xff\x03\x0000")
	_, err := e.Load(context.Background(), billion)
	var f *wasm.Failure
	if !errors.As(err, &f) || f.Reason != wasm.ReasonLoad || !strings.Contains(f.Detail, "runs past the module's end") {
		t.Fatalf("a code section of a billion bodies that ends at once: %v", err)
	}
	m := []byte("\x00asm\x01\x00\x00\x00\x01\b\x02`\x00\x00`\x01~\x00\x03\x03\x02\x000\a\n\x01\x06_start\x00\x00\n \x02\x06\x00A0\x10\x01\v\x17\x00000000000000000000000\v")
	_, err = e.Load(context.Background(), m)
	if !errors.As(err, &f) || f.Reason != wasm.ReasonLoad || !strings.Contains(f.Detail, "the compiler failed") {
		t.Fatalf("a module wazero's validator panics on: %v", err)
	}
	if _, err := e.Load(context.Background(), spinCommand); err != nil {
		t.Fatalf("the engine no longer loads a module: %v", err)
	}
}
