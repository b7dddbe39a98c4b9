// Package builder is the contract between Podium and a prompt builder (docs/builders.md): a
// WebAssembly module, a WASI preview 1 command, that reads one JSON object on stdin and writes one
// JSON object on stdout. Builders written in Go may import it for the types; Podium checks every
// answer here before it uses it.
package builder

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"unicode/utf8"
)

// The operations a builder answers.
const (
	OpBuild = "build"
	OpParse = "parse"
)

// BuildRequest asks for the payload to send a model: Context holds exactly the variables a
// template gets (docs/prompts.md), Vars the request's vars (also under Context's "vars").
type BuildRequest struct {
	Op      string         `json:"op"`
	Model   string         `json:"model"`
	Context map[string]any `json:"context"`
	Vars    map[string]any `json:"vars,omitempty"`
}

// Message is one turn of a chat payload.
type Message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// Built is a builder's answer to build: the messages, the prompt (the host flattens the messages
// when it is absent) and free-form hints recorded with the prompt (a recommended temperature).
type Built struct {
	Messages []Message      `json:"messages"`
	Prompt   *string        `json:"prompt,omitempty"`
	Params   map[string]any `json:"params,omitempty"`
}

// ParseRequest asks to split a model's raw output.
type ParseRequest struct {
	Op     string `json:"op"`
	Model  string `json:"model"`
	Output string `json:"output"`
}

// ToolRequest is a tool the model asked for, with its arguments as the model gave them.
type ToolRequest struct {
	Name      string `json:"name"`
	Arguments any    `json:"arguments"`
}

// Parsed is a builder's answer to parse.
type Parsed struct {
	FinalAnswer  string        `json:"final_answer"`
	ToolRequests []ToolRequest `json:"tool_requests"`
}

// DecodeBuilt reads a build answer: one JSON object with known fields only, at least one message
// or a prompt, every role named, every text valid UTF-8.
func DecodeBuilt(out []byte) (Built, error) {
	var b Built
	if err := decodeOne(out, &b); err != nil {
		return Built{}, err
	}
	if len(b.Messages) == 0 && b.Prompt == nil {
		return Built{}, fmt.Errorf("the answer has neither messages nor a prompt")
	}
	for i, m := range b.Messages {
		if m.Role == "" {
			return Built{}, fmt.Errorf("messages[%d] has no role", i)
		}
		if !utf8.ValidString(m.Role) || !utf8.ValidString(m.Content) {
			return Built{}, fmt.Errorf("messages[%d] is not valid UTF-8", i)
		}
	}
	if b.Prompt != nil && !utf8.ValidString(*b.Prompt) {
		return Built{}, fmt.Errorf("prompt is not valid UTF-8")
	}
	return b, nil
}

// DecodeParsed reads a parse answer: one JSON object with known fields only, every tool named.
func DecodeParsed(out []byte) (Parsed, error) {
	var p Parsed
	if err := decodeOne(out, &p); err != nil {
		return Parsed{}, err
	}
	for i, t := range p.ToolRequests {
		if t.Name == "" {
			return Parsed{}, fmt.Errorf("tool_requests[%d] has no name", i)
		}
	}
	if p.ToolRequests == nil {
		p.ToolRequests = []ToolRequest{}
	}
	return p, nil
}

// decodeOne decodes exactly one JSON object, refusing unknown fields and anything after it.
func decodeOne(out []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(out))
	dec.DisallowUnknownFields()
	dec.UseNumber()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("the answer is not the JSON object of the ABI: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return fmt.Errorf("the answer has more after its JSON object")
	}
	return nil
}
