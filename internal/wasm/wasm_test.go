package wasm_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/podium-llm/podium/internal/testenv"
	"github.com/podium-llm/podium/internal/wasm"
	"github.com/podium-llm/podium/pkg/builder"
)

var limits = wasm.Limits{MemoryPages: 512, OutputBytes: 1 << 20, StderrBytes: 2048}

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
	e := engine(t)
	m := load(t, e, testenv.BuildWasm(t, "../../builders/phi4mini"))
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
	e := engine(t)
	good := load(t, e, testenv.BuildWasm(t, "../../builders/phi4mini"))
	cases := []struct {
		name, reason, detail string
		module               []byte
	}{
		{"trap", wasm.ReasonTrap, "unreachable", trapModule},
		{"loop", wasm.ReasonTimeout, "deadline", testenv.BuildWasm(t, "./testdata/loop")},
		{"alloc", wasm.ReasonMemory, "out of memory", testenv.BuildWasm(t, "./testdata/alloc")},
		{"clock", wasm.ReasonClock, "wall clock", testenv.BuildWasm(t, "./testdata/clock")},
		{"file", wasm.ReasonExit, "cannot read /etc/passwd", testenv.BuildWasm(t, "./testdata/file")},
		{"flood", wasm.ReasonTooLarge, "over 1048576 bytes", testenv.BuildWasm(t, "./testdata/flood")},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := load(t, e, c.module)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			out, err := m.Run(ctx, []byte(buildInput), requestTime)
			var f *wasm.Failure
			if !errors.As(err, &f) {
				t.Fatalf("want a Failure, got %v (answer %.200q)", err, out)
			}
			if f.Reason != c.reason || !strings.Contains(f.Error(), c.detail) {
				t.Fatalf("failure %q, want reason %s mentioning %q", f.Error(), c.reason, c.detail)
			}
			if _, err := good.Run(context.Background(), []byte(buildInput), requestTime); err != nil {
				t.Fatalf("the engine no longer serves a good builder: %v", err)
			}
		})
	}
	// An answer that is not the ABI's is the caller's to refuse.
	out, err := load(t, e, testenv.BuildWasm(t, "./testdata/badjson")).Run(context.Background(), []byte(buildInput), requestTime)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := builder.DecodeBuilt(out); err == nil {
		t.Fatalf("%q decoded as an answer", out)
	}
	// Not a WASI command: refused at load.
	if _, err := e.Load(context.Background(), trapModule[:len(trapModule)-7]); err == nil {
		t.Fatal("a module without code loaded")
	}
	if _, err := e.Load(context.Background(), []byte("not wasm")); err == nil {
		t.Fatal("garbage loaded")
	}
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
	// A start section that traps: the instance fails while it is being made, its memory made.
	startTrap := []byte{
		0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00,
		0x01, 0x04, 0x01, 0x60, 0x00, 0x00, // types: () -> ()
		0x03, 0x03, 0x02, 0x00, 0x00, // functions 0 and 1
		0x05, 0x03, 0x01, 0x00, 0x01, // a memory of one page
		0x07, 0x0a, 0x01, 0x06, '_', 's', 't', 'a', 'r', 't', 0x00, 0x01, // export "_start" = function 1
		0x08, 0x01, 0x00, // start: function 0
		0x0a, 0x08, 0x02, 0x03, 0x00, 0x00, 0x0b, 0x02, 0x00, 0x0b, // 0: unreachable; 1: nothing
	}
	modules["start-trap"] = load(t, e, startTrap)
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
