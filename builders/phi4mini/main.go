//go:build wasip1

// Command phi4mini is Podium's example prompt builder (docs/builders.md) for Phi-4-mini: it
// builds the model's <|system|>/<|user|>/<|assistant|> turns, with the request's tools in a
// <|tool|> block of the system turn, from the variables a template gets; and it parses the
// model's output into its final answer and the <|tool_call|> blocks it asked for.
//
// Build it with:
//
//	GOOS=wasip1 GOARCH=wasm go build -o phi4mini.wasm ./builders/phi4mini
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	"github.com/podium-llm/podium/pkg/builder"
)

func main() {
	in, err := io.ReadAll(os.Stdin)
	if err != nil {
		fail("reading stdin: %v", err)
	}
	var op struct {
		Op string `json:"op"`
	}
	if err := json.Unmarshal(in, &op); err != nil {
		fail("the input is not JSON: %v", err)
	}
	var out any
	switch op.Op {
	case builder.OpBuild:
		var req builder.BuildRequest
		if err := json.Unmarshal(in, &req); err != nil {
			fail("build: %v", err)
		}
		out = build(req)
	case builder.OpParse:
		var req builder.ParseRequest
		if err := json.Unmarshal(in, &req); err != nil {
			fail("parse: %v", err)
		}
		out = parse(req.Output)
	default:
		fail("unknown op %q", op.Op)
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetEscapeHTML(false) // the turns' markers stay readable: <|user|>
	if err := enc.Encode(out); err != nil {
		fail("writing the answer: %v", err)
	}
}

// fail ends the builder with a reason on stderr, which the host records with its fallback.
func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
	os.Exit(1)
}
