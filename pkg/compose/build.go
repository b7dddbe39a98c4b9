package compose

import (
	"context"
	"fmt"
	"time"

	"github.com/podium-llm/podium/pkg/builder"
	"github.com/podium-llm/podium/pkg/events"
)

// Builder builds a request's prompt in place of its template (docs/builders.md), from exactly
// the variables the template gets. It must be deterministic: the same request gives the same
// answer. internal/composer runs WebAssembly builders; an error is a fallback to the template,
// recorded with its reason.
type Builder interface {
	Ref() events.BuilderRef
	Build(ctx context.Context, req builder.BuildRequest) (builder.Built, error)
}

// build renders in with its builder: the variables of the template's first budget step (no
// cuts: a builder sees the whole of what the template would print), its answer flattened when
// it gave no prompt, counted, and held to max_prompt_tokens. It returns the render and the
// builder's hints.
func (l *Library) build(ctx context.Context, in Inputs, lim Limits, loc *time.Location, contentFrom int) (rendered, map[string]any, error) {
	steps := budgetSteps(in, lim, contentFrom)
	vals := buildContext(in, lim, loc, steps[0], func(string) bool { return true })
	built, err := in.Builder.Build(ctx, builder.BuildRequest{Op: builder.OpBuild, Model: in.Request.Model, Context: vals, Vars: in.Request.Vars})
	if err != nil {
		return rendered{}, nil, err
	}
	r := rendered{cuts: steps[0], messages: make([]events.Message, len(built.Messages))}
	for i, m := range built.Messages {
		r.messages[i] = events.Message{Role: m.Role, Content: m.Content}
	}
	if built.Prompt != nil {
		r.prompt = *built.Prompt
	} else {
		r.prompt = flatten("", r.messages)
	}
	if r.tokens, err = l.tokens.Count(ctx, r.prompt); err != nil {
		return rendered{}, nil, err
	}
	if lim.MaxPromptTokens > 0 && r.tokens > lim.MaxPromptTokens {
		return rendered{}, nil, fmt.Errorf("budget: the built prompt is %d tokens (%s), over max_prompt_tokens %d", r.tokens, l.tokens.Name(), lim.MaxPromptTokens)
	}
	return r, built.Params, nil
}
