//go:build wasip1

package main

import (
	"encoding/json"
	"strings"

	"github.com/podium-llm/podium/pkg/builder"
)

// parse splits Phi-4-mini's output: each <|tool_call|>[...]<|/tool_call|> block is a JSON list
// of {"name", "arguments"}, the rest (the end-of-turn marker dropped) is the final answer. A
// block that is not such a list stays in the answer, as the model wrote it.
func parse(output string) builder.Parsed {
	const open, end = "<|tool_call|>", "<|/tool_call|>"
	out := builder.Parsed{ToolRequests: []builder.ToolRequest{}}
	var answer strings.Builder
	rest := output
	for {
		i := strings.Index(rest, open)
		if i < 0 {
			break
		}
		j := strings.Index(rest[i:], end)
		if j < 0 {
			break
		}
		var calls []builder.ToolRequest
		block := rest[i+len(open) : i+j]
		if err := json.Unmarshal([]byte(block), &calls); err != nil || !named(calls) {
			answer.WriteString(rest[:i+j+len(end)])
		} else {
			answer.WriteString(rest[:i])
			out.ToolRequests = append(out.ToolRequests, calls...)
		}
		rest = rest[i+j+len(end):]
	}
	answer.WriteString(rest)
	out.FinalAnswer = strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(answer.String()), "<|end|>"))
	return out
}

func named(calls []builder.ToolRequest) bool {
	for _, c := range calls {
		if c.Name == "" {
			return false
		}
	}
	return true
}
