package compose

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/podium-llm/podium/pkg/builder"
	"github.com/podium-llm/podium/pkg/events"
)

// goBuilder is a Builder written in Go: what internal/builders does with a WebAssembly module,
// here a function of the request.
type goBuilder struct {
	build func(req builder.BuildRequest) (builder.Built, error)
	got   builder.BuildRequest
}

func (g *goBuilder) Ref() events.BuilderRef {
	return events.BuilderRef{Name: "go", Version: 3, SHA256: strings.Repeat("c", 64)}
}

func (g *goBuilder) Build(_ context.Context, req builder.BuildRequest) (builder.Built, error) {
	g.got = req
	return g.build(req)
}

// TestBuilderBuildsOrFallsBack: a builder's answer is the prompt, recorded with its version and
// hints, from exactly the variables the template gets; messages without a prompt are joined; a
// failure, or a prompt over max_prompt_tokens, is the template's prompt with the reason recorded.
func TestBuilderBuildsOrFallsBack(t *testing.T) {
	l := testLibrary(t)
	in := goldenCases()["round3-history-ties"]
	plain, err := l.Compose(context.Background(), in)
	if err != nil {
		t.Fatal(err)
	}

	text := "<|user|>built<|end|><|assistant|>"
	g := &goBuilder{build: func(req builder.BuildRequest) (builder.Built, error) {
		return builder.Built{Messages: []builder.Message{{Role: "user", Content: "built"}}, Prompt: &text, Params: map[string]any{"temperature": 0.2}}, nil
	}}
	in.Builder = g
	out, err := l.Compose(context.Background(), in)
	if err != nil {
		t.Fatal(err)
	}
	if out.Prompt != text || out.Builder == nil || out.Builder.Fallback || out.Builder.Name != "go" || out.Params["temperature"] != 0.2 ||
		len(out.Messages) != 1 || out.Messages[0].Content != "built" || len(out.Truncated) != 0 || out.Template != plain.Template {
		t.Fatalf("built: %+v", out)
	}
	// The builder got the variables a template gets: the request's, and its whole history.
	if g.got.Op != builder.OpBuild || g.got.Context["user_prompt"] != in.Request.UserPrompt || g.got.Context["round_number"] != in.Request.RoundNumber {
		t.Fatalf("build request %+v", g.got)
	}
	history, _ := g.got.Context["history"].([]any)
	if len(history) != len(in.History) {
		t.Fatalf("the builder saw %d rounds of history, the request has %d", len(history), len(in.History))
	}

	g.build = func(builder.BuildRequest) (builder.Built, error) {
		return builder.Built{Messages: []builder.Message{{Role: "system", Content: "a"}, {Role: "user", Content: "b"}}}, nil
	}
	if out, err := l.Compose(context.Background(), in); err != nil || out.Prompt != "a\n\nb" {
		t.Fatalf("messages without a prompt: %q %v", out.Prompt, err)
	}

	for name, build := range map[string]func(builder.BuildRequest) (builder.Built, error){
		"builder trap: unreachable": func(builder.BuildRequest) (builder.Built, error) {
			return builder.Built{}, errors.New("builder trap: unreachable")
		},
		"budget: the built prompt is": func(builder.BuildRequest) (builder.Built, error) {
			long := strings.Repeat("word ", 100_000)
			return builder.Built{Prompt: &long}, nil
		},
	} {
		g.build = build
		out, err := l.Compose(context.Background(), in)
		if err != nil {
			t.Fatal(err)
		}
		if out.Prompt != plain.Prompt || out.PromptSHA256 != plain.PromptSHA256 || out.Builder == nil || !out.Builder.Fallback ||
			!strings.HasPrefix(out.Builder.Reason, name) || out.Params != nil {
			t.Fatalf("%s: fell back to %+v (reason %q)", name, out.Builder, out.Builder.Reason)
		}
	}
}
