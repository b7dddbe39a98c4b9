package wasm_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/podium-llm/podium/internal/testenv"
	"github.com/podium-llm/podium/internal/wasm"
	"github.com/podium-llm/podium/pkg/builder"
)

// Start: a warm-up that never ends (testdata/loop) holds a load that long.
var limits = wasm.Limits{MemoryPages: 512, OutputBytes: 1 << 20, StderrBytes: 2048, Start: 2 * time.Second}

func engine(t *testing.T) *wasm.Engine {
	t.Helper()
	e, err := wasmEngine(t)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func wasmEngine(tb testing.TB) (*wasm.Engine, error) {
	e, err := wasm.NewEngine(context.Background(), limits)
	if err == nil {
		tb.Cleanup(func() { e.Close(context.Background()) })
	}
	return e, err
}

func load(t *testing.T, e *wasm.Engine, wasmBytes []byte) *wasm.Module {
	t.Helper()
	m, err := e.Load(context.Background(), wasmBytes)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

var requestTime = time.Date(2026, 3, 1, 9, 30, 0, 0, time.UTC)

const buildInput = `{"op":"build","model":"phi-4-mini","context":{"team":{"id":"t1","name":"Team One"},"user_prompt":"Sort the list.","round_number":2,"is_first_round":false,"current_datetime":"2026-03-01T09:30:00",` +
	`"history":[{"round_number":1,"score_text":"0.40","feedback":"too slow","preview":"bubble sort"}],` +
	`"leaderboard":[{"position":1,"team_name":"Team Two","best_score_text":"0.90","best_round":1,"is_self":false},{"position":2,"team_name":"Team One","best_score_text":"0.40","best_round":1,"is_self":true}]},` +
	`"vars":{"tools":[{"name":"run_tests","description":"runs the tests"}]}}`

// TestExampleBuilder: the shipped Phi-4-mini builder builds the model's turns with the tools
// block, the same bytes on every run and from runs side by side, and parses tool calls.
func TestExampleBuilder(t *testing.T) {
	for kind, build := range builds {
		t.Run(kind, func(t *testing.T) { exampleBuilder(t, build) })
	}
}

// builds are the two ways a Go builder is built: a command, whose runtime starts in every call,
// and a reactor, whose runtime started once, at load.
var builds = map[string]func(testing.TB, string) []byte{
	wasm.KindCommand: testenv.BuildWasm,
	wasm.KindReactor: testenv.BuildWasmReactor,
}

func exampleBuilder(t *testing.T, build func(testing.TB, string) []byte) {
	e := engine(t)
	m := load(t, e, build(t, "../../builders/phi4mini"))
	first, err := m.Run(context.Background(), []byte(buildInput), requestTime)
	if err != nil {
		t.Fatal(err)
	}
	built, err := builder.DecodeBuilt(first)
	if err != nil {
		t.Fatalf("%v: %s", err, first)
	}
	want := "<|system|>You are Team One (team id t1), one of several teams competing on the same task over several rounds. An evaluator scores every submission; the best score wins. Answer with your complete submission only." +
		`<|tool|>[{"description":"runs the tests","name":"run_tests"}]<|/tool|><|end|>` +
		"<|user|># Task\nSort the list.\n\n# Round\nRound 2. Current time: 2026-03-01T09:30:00\n\n# Your previous rounds\n\n## Round 1: 0.40\nEvaluator feedback: too slow\nYour submission:\nbubble sort\n\n" +
		"# Leaderboard\n1. Team Two: best 0.90 in round 1\n2. Team One: best 0.40 in round 1 <- your team\n\n" +
		"Keep what scored well, fix what the evaluator criticised, and write your complete new submission for round 2.\n<|end|><|assistant|>"
	if built.Prompt == nil || *built.Prompt != want {
		t.Fatalf("prompt:\n%q\nwant:\n%q", deref(built.Prompt), want)
	}
	if len(built.Messages) != 2 || built.Messages[0].Role != "system" || built.Messages[1].Role != "user" {
		t.Fatalf("messages %+v", built.Messages)
	}
	var wg sync.WaitGroup
	outs := make([][]byte, 8)
	errs := make([]error, 8)
	for i := range outs {
		wg.Go(func() { outs[i], errs[i] = m.Run(context.Background(), []byte(buildInput), requestTime) })
	}
	wg.Wait()
	for i := range outs {
		if errs[i] != nil || !bytes.Equal(outs[i], first) {
			t.Fatalf("run %d side by side: %v, same bytes %v", i, errs[i], bytes.Equal(outs[i], first))
		}
	}
	out, err := m.Run(context.Background(), []byte(`{"op":"parse","model":"phi-4-mini","output":"Running them. <|tool_call|>[{\"name\":\"run_tests\",\"arguments\":{\"only\":\"sort\"}}]<|/tool_call|> Done.<|end|>"}`), requestTime)
	if err != nil {
		t.Fatal(err)
	}
	p, err := builder.DecodeParsed(out)
	if err != nil {
		t.Fatal(err)
	}
	if p.FinalAnswer != "Running them.  Done." || len(p.ToolRequests) != 1 || p.ToolRequests[0].Name != "run_tests" {
		t.Fatalf("parsed %+v", p)
	}
}

func deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}

// trapReactor is a reactor whose _initialize does nothing and whose podium_run executes
// unreachable: a trap at every call (and at the warm-up, which then keeps the state _initialize
// left).
var trapReactor = []byte{
	0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00, // magic, version 1
	0x01, 0x08, 0x02, 0x60, 0x00, 0x00, 0x60, 0x00, 0x01, 0x7f, // types: () -> (), () -> i32
	0x03, 0x03, 0x02, 0x00, 0x01, // functions: one of each type
	0x05, 0x03, 0x01, 0x00, 0x01, // a memory of one page
	0x07, 0x25, 0x03, // exports: _initialize, podium_run, memory
	0x0b, '_', 'i', 'n', 'i', 't', 'i', 'a', 'l', 'i', 'z', 'e', 0x00, 0x00,
	0x0a, 'p', 'o', 'd', 'i', 'u', 'm', '_', 'r', 'u', 'n', 0x00, 0x01,
	0x06, 'm', 'e', 'm', 'o', 'r', 'y', 0x02, 0x00,
	0x0a, 0x08, 0x02, 0x02, 0x00, 0x0b, 0x03, 0x00, 0x00, 0x0b, // code: nothing; unreachable
}

// tableSetReactor is a reactor whose podium_run sets its table's slot 0 (to null) and answers 0:
// state outside memory and globals.
var tableSetReactor = []byte{
	0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00,
	0x01, 0x08, 0x02, 0x60, 0x00, 0x00, 0x60, 0x00, 0x01, 0x7f, // types: () -> (), () -> i32
	0x03, 0x03, 0x02, 0x00, 0x01, // functions: one of each type
	0x04, 0x04, 0x01, 0x70, 0x00, 0x01, // a table of funcref, one slot
	0x05, 0x03, 0x01, 0x00, 0x01, // a memory of one page
	0x07, 0x25, 0x03,
	0x0b, '_', 'i', 'n', 'i', 't', 'i', 'a', 'l', 'i', 'z', 'e', 0x00, 0x00,
	0x0a, 'p', 'o', 'd', 'i', 'u', 'm', '_', 'r', 'u', 'n', 0x00, 0x01,
	0x06, 'm', 'e', 'm', 'o', 'r', 'y', 0x02, 0x00,
	0x0a, 0x0f, 0x02, 0x02, 0x00, 0x0b, // code: nothing;
	0x0a, 0x00, 0x41, 0x00, 0xd0, 0x70, 0x26, 0x00, 0x41, 0x00, 0x0b, // table.set 0 (i32.const 0, ref.null func); i32.const 0
}

// trapModule is a WASI command whose _start executes unreachable: a trap, in 38 bytes.
var trapModule = []byte{
	0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00, // magic, version 1
	0x01, 0x04, 0x01, 0x60, 0x00, 0x00, // types: () -> ()
	0x03, 0x02, 0x01, 0x00, // functions: one of type 0
	0x07, 0x0a, 0x01, 0x06, '_', 's', 't', 'a', 'r', 't', 0x00, 0x00, // export "_start" = function 0
	0x0a, 0x05, 0x01, 0x03, 0x00, 0x00, 0x0b, // code: no locals, unreachable, end
}

// TestHostileBuilders: each way a builder can misbehave ends as a Failure naming it, within the
// deadline, and the engine goes on serving.
func TestHostileBuilders(t *testing.T) {
	for kind, build := range builds {
		t.Run(kind, func(t *testing.T) {
			trap := trapModule
			if kind == wasm.KindReactor {
				trap = trapReactor
			}
			hostileBuilders(t, kind, build, trap)
		})
	}
}

func hostileBuilders(t *testing.T, kind string, build func(testing.TB, string) []byte, trap []byte) {
	e := engine(t)
	good := load(t, e, build(t, "../../builders/phi4mini"))
	cases := []struct {
		name, reason, detail string
		module               []byte
	}{
		{"trap", wasm.ReasonTrap, "unreachable", trap},
		{"loop", wasm.ReasonTimeout, "deadline", build(t, "./testdata/loop")},
		{"alloc", wasm.ReasonMemory, "out of memory", build(t, "./testdata/alloc")},
		{"clock", wasm.ReasonClock, "wall clock", build(t, "./testdata/clock")},
		{"file", wasm.ReasonExit, "cannot read /etc/passwd", build(t, "./testdata/file")},
		{"flood", wasm.ReasonTooLarge, "over 1048576 bytes", build(t, "./testdata/flood")},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if kind == wasm.KindReactor && c.name == "loop" {
				// Its warm-up never ends: how far it got would make the snapshot, and depend on
				// the machine. Refused at load, within Limits.Start.
				start := time.Now()
				_, err := e.Load(context.Background(), c.module)
				var f *wasm.Failure
				if !errors.As(err, &f) || f.Reason != wasm.ReasonLoad || !strings.Contains(f.Detail, "did not finish within 2s") || time.Since(start) > 30*time.Second {
					t.Fatalf("a reactor whose warm-up never ends: %v after %s", err, time.Since(start))
				}
				return
			}
			m := load(t, e, c.module)
			if m.Kind() != kind {
				t.Fatalf("loaded as a %s", m.Kind())
			}
			for call := range 2 { // a reactor's second call starts from the snapshot as its first did
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				out, err := m.Run(ctx, []byte(buildInput), requestTime)
				cancel()
				var f *wasm.Failure
				if !errors.As(err, &f) {
					t.Fatalf("call %d: want a Failure, got %v (answer %.200q)", call, err, out)
				}
				if f.Reason != c.reason || !strings.Contains(f.Error(), c.detail) {
					t.Fatalf("call %d: failure %q, want reason %s mentioning %q", call, f.Error(), c.reason, c.detail)
				}
				if _, err := good.Run(context.Background(), []byte(buildInput), requestTime); err != nil {
					t.Fatalf("the engine no longer serves a good builder: %v", err)
				}
			}
		})
	}
	// An answer that is not the ABI's is the caller's to refuse.
	out, err := load(t, e, build(t, "./testdata/badjson")).Run(context.Background(), []byte(buildInput), requestTime)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := builder.DecodeBuilt(out); err == nil {
		t.Fatalf("%q decoded as an answer", out)
	}
	// Neither kind, or not a module: refused at load.
	if _, err := e.Load(context.Background(), trapModule[:len(trapModule)-7]); err == nil {
		t.Fatal("a module without code loaded")
	}
	if kind == wasm.KindReactor {
		// A reactor whose code changes a table: its snapshot could not set it back.
		if _, err := e.Load(context.Background(), tableSetReactor); err == nil || !strings.Contains(err.Error(), "table.set changes a table") {
			t.Fatalf("a reactor that sets a table: %v", err)
		}
	}
	noRun := bytes.Replace(trapReactor, []byte("podium_run"), []byte("podium_xyz"), 1)
	if _, err := e.Load(context.Background(), noRun); err == nil || !strings.Contains(err.Error(), "exports neither _start") {
		t.Fatalf("a module with neither _start nor podium_run: %v", err)
	}
	if _, err := e.Load(context.Background(), []byte("not wasm")); err == nil {
		t.Fatal("garbage loaded")
	}
}

// TestReactorCallsStartFromTheSnapshot: a reactor that keeps what it can between calls (a
// counter, the inputs it read, a goroutine's work, a map, a file) answers every call alike, one
// after another and side by side, whatever the calls before read: each starts from the state its
// load left, never from another call's.
func TestReactorCallsStartFromTheSnapshot(t *testing.T) {
	e := engine(t)
	m := load(t, e, testenv.BuildWasmReactor(t, "./testdata/state"))
	first, err := m.Run(context.Background(), []byte(`{"op":"build"}`), requestTime)
	if err != nil {
		t.Fatal(err)
	}
	// The warm-up's two calls are the only ones it ever saw before.
	if !strings.Contains(string(first), "calls 3, inputs seen 3") || !strings.Contains(string(first), "wrote false") {
		t.Fatalf("the first call: %s", first)
	}
	for i := range 5 {
		in := fmt.Sprintf(`{"op":"build","n":%d}`, i)
		if i == 2 {
			in = `{"op":"close"}` // it tries to close its stdin and stdout
		}
		if _, err := m.Run(context.Background(), []byte(in), requestTime); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	outs := make([][]byte, 6)
	errs := make([]error, len(outs))
	for i := range outs {
		wg.Go(func() { outs[i], errs[i] = m.Run(context.Background(), []byte(`{"op":"build"}`), requestTime) })
	}
	wg.Wait()
	for i, out := range outs {
		if errs[i] != nil || !bytes.Equal(out, first) {
			t.Fatalf("call %d: %v\n%s\nwant, as the first call:\n%s", i, errs[i], out, first)
		}
	}
	t.Logf("every call: %s", first)
}

// TestInstancesGiveTheirMemoryBack: whatever ends a call (an answer, a timeout, memory run out,
// a trap), its instance's memory mapping is given back.
func TestInstancesGiveTheirMemoryBack(t *testing.T) {
	e := engine(t)
	modules := map[string]*wasm.Module{
		"good":  load(t, e, testenv.BuildWasm(t, "../../builders/phi4mini")),
		"loop":  load(t, e, testenv.BuildWasm(t, "./testdata/loop")),
		"alloc": load(t, e, testenv.BuildWasm(t, "./testdata/alloc")),
		"clock": load(t, e, testenv.BuildWasm(t, "./testdata/clock")),
		"flood": load(t, e, testenv.BuildWasm(t, "./testdata/flood")),
	}
	// A data segment past its memory: the instance fails while it is being made, its memory made.
	// (A start section that traps did this before; start sections are refused now: interrupt.go.)
	dataPast := testenv.WasmCommand(testenv.NoLocals, nil, map[byte][]byte{
		5:  testenv.Section(5, []byte{0x01, 0x00, 0x01}),                                      // a memory of one page
		11: testenv.Section(11, []byte{0x01, 0x00, 0x41, 0x80, 0x80, 0x04, 0x0b, 0x01, 0x00}), // 1 byte at 65536
	})
	modules["data-past"] = load(t, e, dataPast)
	for name, m := range modules {
		for range 3 {
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			_, _ = m.Run(ctx, []byte(buildInput), requestTime)
			cancel()
		}
		if n := e.Mapped(); n != 0 {
			t.Fatalf("after 3 calls of %s, %d instances' mappings are still held", name, n)
		}
	}
}

// TestReactorInstancesGiveTheirMemoryBack: a reactor keeps at most one instance per call that may
// run at once (here, one at a time: one) for the calls after; a call that failed gives its
// instance's memory back, and a reactor freed from the cache gives back every instance it kept.
func TestReactorInstancesGiveTheirMemoryBack(t *testing.T) {
	e := engine(t)
	// A reactor keeps at most one instance per call that may run at once (here one at a time: one)
	// for the calls after; a call that failed gives its instance back.
	reactors := map[string]*wasm.Module{
		"reactor good":  load(t, e, testenv.BuildWasmReactor(t, "../../builders/phi4mini")),
		"reactor alloc": load(t, e, testenv.BuildWasmReactor(t, "./testdata/alloc")),
		"reactor flood": load(t, e, testenv.BuildWasmReactor(t, "./testdata/flood")),
		"reactor trap":  load(t, e, trapReactor),
	}
	kept := e.Mapped() // the instances the loads made and kept, one per reactor whose warm-up ended well
	for name, m := range reactors {
		for range 3 {
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			_, _ = m.Run(ctx, []byte(buildInput), requestTime)
			cancel()
		}
		if n := e.Mapped(); n > kept+1 || name != "reactor good" && n > kept {
			t.Fatalf("after 3 calls of %s, %d instances' mappings are held (%d before)", name, n, kept)
		}
		kept = e.Mapped()
	}
	if kept > 1 {
		t.Fatalf("%d reactor instances kept, where only the good builder's calls end well", kept)
	}
	// The cache (8 modules) keeps them all: filling it with others frees the reactors.
	for i := range 12 {
		load(t, e, version(trapReactor, i))
	}
	if n := e.Mapped(); n != 0 {
		t.Fatalf("the reactors freed, %d instances' mappings are still held", n)
	}
}
