package wasm_test

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/podium-llm/podium/internal/testenv"
	"github.com/podium-llm/podium/internal/wasm"
)

// exampleInputs are requests both examples must answer alike: the shapes of a build (first round,
// later rounds, tools, a leaderboard) and of a parse (tool calls, blocks that are not, an end
// marker), with the strings JSON makes hard (quotes, <, > and &, control characters, U+2028,
// other scripts) and numbers of every form.
var exampleInputs = []string{
	buildInput,
	`{"op":"build","model":"phi-4-mini","context":{"team":{"id":"t9","name":"Équipe \"Neuf\" <9> & co"},"user_prompt":"Line one\nline\ttwo\u2028three 語","round_number":1,"is_first_round":true,"current_datetime":"2026-03-01T09:30:00"}}`,
	`{"op":"build","model":"phi-4-mini","context":{"team":{"id":"t1","name":"One"},"user_prompt":"x","round_number":2.5,"is_first_round":false,"current_datetime":"now","history":[{"round_number":1,"score_text":"12.50","feedback":"","preview":"p\u0001q"},{"round_number":2,"score_text":"-1","feedback":"better\r\n","preview":"<code>&amp;</code>"}],"leaderboard":[{"position":1,"team_name":"Two","best_score_text":"0.9","best_round":3},{"position":2,"team_name":"One","best_score_text":"0.4","best_round":1,"is_self":true}]},` +
		`"vars":{"tools":[{"name":"search","parameters":{"type":"object","z":1e21,"a":[0.5,1e-7,123456789,-0.0,3]},"description":"finds <things> & more"},{"name":"run","description":"x"}]}}`,
	`{"op":"build","model":"phi-4-mini","context":{},"vars":{"tools":[]}}`,
	`{"op":"parse","model":"phi-4-mini","output":"Thinking done. <|tool_call|>[{\"name\":\"search\",\"arguments\":{\"q\":\"<b> & c\",\"n\":2,\"a\":[1.5,{\"y\":null,\"x\":true}]}}]<|/tool_call|> then <|tool_call|>[{\"arguments\":{}}]<|/tool_call|> and <|tool_call|>not json<|/tool_call|> final answer <|end|>"}`,
	`{"op":"parse","model":"phi-4-mini","output":"  just an answer\n<|end|>\n"}`,
	`{"op":"parse","model":"phi-4-mini","output":"<|tool_call|>[{\"name\":\"a\"},{\"name\":\"b\",\"arguments\":[1,2]}]<|/tool_call|><|tool_call|>unclosed"}`,
}

// TestExampleBuildersAgree: the example builder as a Go reactor, in C and in Rust, answers every
// input with the very bytes of the Go command (so any of them may serve production, and a record of one
// verifies with another's rules), the reactor called on each input in turn from one snapshot.
func TestExampleBuildersAgree(t *testing.T) {
	e := engine(t)
	goModule := load(t, e, testenv.BuildWasm(t, "../../builders/phi4mini"))
	others := map[string]*wasm.Module{
		"the Go reactor": load(t, e, testenv.BuildWasmReactor(t, "../../builders/phi4mini")),
		"the C builder":  load(t, e, testenv.BuildC(t, "../../builders/phi4mini-c")),
		"the Rust one":   load(t, e, testenv.BuildRust(t, "../../builders/phi4mini-rs")),
	}
	total := 0
	for i, in := range exampleInputs {
		want, err := goModule.Run(context.Background(), []byte(in), requestTime)
		if err != nil {
			t.Fatalf("input %d, the Go command: %v", i, err)
		}
		for name, m := range others {
			got, err := m.Run(context.Background(), []byte(in), requestTime)
			if err != nil {
				t.Fatalf("input %d, %s: %v", i, name, err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("input %d: %s answers\n%s\nthe Go command\n%s", i, name, got, want)
			}
		}
		total += len(want)
	}
	t.Logf("%d inputs: the same %d bytes of answers from all four; the reactor's snapshot: %d bytes", len(exampleInputs), total, others["the Go reactor"].SnapshotBytes())
	for name, m := range others {
		if _, err := m.Run(context.Background(), []byte(`{"op":"nothing"}`), requestTime); err == nil || !strings.Contains(err.Error(), "unknown op") {
			t.Errorf("%s, an unknown op: %v", name, err)
		}
	}
}

// edgeInputs are inputs where encoding/json's rules are easy to miss: numbers past float64,
// a null block of tool calls, fields matched in any case, a name of another type, a context given
// twice, and inputs the Go builder refuses.
var edgeInputs = []string{
	`{"op":"parse","output":"a <|tool_call|>[{\"name\":\"a\",\"arguments\":{\"x\":1e400}}]<|/tool_call|> b"}`,
	`{"op":"parse","output":"a <|tool_call|>null<|/tool_call|> b"}`,
	`{"op":"parse","output":"<|tool_call|>[{\"Name\":\"a\",\"ARGUMENTS\":{\"k\":1}}]<|/tool_call|>"}`,
	`{"op":"parse","output":"<|tool_call|>[{\"name\":5,\"name\":\"a\"}]<|/tool_call|>"}`,
	`{"op":"parse","output":"<|tool_call|>[{\"name\":\"a\",\"name\":null}]<|/tool_call|>"}`,
	`{"OP":"build","Context":{"team":{"id":"t","name":"T"},"round_number":1,"is_first_round":true}}`,
	`{"op":"build","context":{"team":{"id":"t","name":"T"}},"context":{"round_number":3}}`,
	`{"op":"build","model":1,"context":{}}`,
	`{"op":"build","context":{}} trailing`,
	`{"op":"build","context":{"round_number":1e400}}`,
	`{"op":"build","context":"s"}`,
	`{"op":"build","context":{"team":{"id":"t","name":"T"}},"context":null}`,
	`{"op":"build","context":{},"extra":1e400}`,
	`{"op":"parse","output":"<|tool_call|>[{\"name\":\"a\",\"x\":1e400}]<|/tool_call|>"}`,
	`{"op":"parse","output":"<|tool_call|>[{\"name\":\"a\",\"argumentſ\":{\"k\":1}}]<|/tool_call|>"}`,
}

// TestRustBuilderFollowsEncodingJSON: on the edge inputs, the Rust example answers the very bytes
// of the Go one, or fails where it fails.
func TestRustBuilderFollowsEncodingJSON(t *testing.T) {
	e := engine(t)
	goModule := load(t, e, testenv.BuildWasm(t, "../../builders/phi4mini"))
	rust := load(t, e, testenv.BuildRust(t, "../../builders/phi4mini-rs"))
	for i, in := range edgeInputs {
		want, wantErr := goModule.Run(context.Background(), []byte(in), requestTime)
		got, err := rust.Run(context.Background(), []byte(in), requestTime)
		if (err == nil) != (wantErr == nil) || !bytes.Equal(got, want) {
			t.Errorf("input %d %s:\nRust %s (%v)\nGo   %s (%v)", i, in, got, err, want, wantErr)
		}
	}
}
