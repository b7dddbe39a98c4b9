//go:build wasip1

// Command phi4mini is Podium's example prompt builder (docs/builders.md) for Phi-4-mini: it
// builds the model's <|system|>/<|user|>/<|assistant|> turns, with the request's tools in a
// <|tool|> block of the system turn, from the variables a template gets; and it parses the
// model's output into its final answer and the <|tool_call|> blocks it asked for.
//
// Build it as a reactor, whose runtime starts once per module (the way to serve it), with:
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o phi4mini.wasm ./builders/phi4mini
//
// or as a command, whose runtime starts in every call (about 30 times the cost), without
// -buildmode.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	"github.com/podium-llm/podium/pkg/builder"
)

// main is the builder as a WASI command: its runtime starts in every call.
func main() { os.Exit(int(run())) }

// podiumRun is the builder as a reactor (-buildmode=c-shared): its runtime started once, when the
// host loaded it, and every call starts from the memory that left (docs/builders.md).
//
//go:wasmexport podium_run
func podiumRun() int32 { return run() }

// run answers the request on stdin: 0 with the answer on stdout, else 1 with the reason on stderr.
func run() int32 {
	in, err := io.ReadAll(os.Stdin)
	if err != nil {
		return fail("reading stdin: %v", err)
	}
	// One decoding of the input for either op: in WebAssembly, Go's encoding/json is most of a
	// builder's cost, and a first pass for the op alone read the whole input twice.
	var req struct {
		builder.BuildRequest
		Output string `json:"output"` // of a parse
	}
	if err := json.Unmarshal(in, &req); err != nil {
		return fail("the input is not the ABI's JSON: %v", err)
	}
	var out any
	switch req.Op {
	case builder.OpBuild:
		out = build(req.BuildRequest)
	case builder.OpParse:
		out = parse(req.Output)
	default:
		return fail("unknown op %q", req.Op)
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetEscapeHTML(false) // the turns' markers stay readable: <|user|>
	if err := enc.Encode(out); err != nil {
		return fail("writing the answer: %v", err)
	}
	return 0
}

// fail says why the builder gave no answer, on stderr, which the host records with its fallback.
func fail(format string, args ...any) int32 {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
	return 1
}
