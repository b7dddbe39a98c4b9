package composer

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/internal/audit"
	"github.com/podium-llm/podium/pkg/compose"
	"github.com/podium-llm/podium/pkg/events"
)

// A request's template reference is read once (compose.Library.Reference) and resolved once to the
// template that renders it, before anything is read or rendered; the reads, the render and the
// record all use that template. A label split between versions (pkg/compose/split.go) is first
// given one of them: the version the team was served under that label earlier in the execution,
// found in PROMPTS, or else the one its hash chooses. The record says the label too, and the
// split's weights as they stood then.

// maxPrevious bounds the team's earlier records looked at for one served under the label: a team
// asks with one template in an execution, so the first is the one.
const maxPrevious = 16

// resolve reads the request's template reference once and resolves it to the template that
// renders the request, with the label it resolved through ("" when it names no registry label) and,
// where that label splits between versions, the split that assigned it one ("" otherwise).
func (c *composer) resolve(ctx context.Context, lib *compose.Library, req events.RoundRequested) (t *compose.Template, label, splitOf string, err error) {
	ref, err := lib.Reference(req.Template)
	if err != nil {
		return nil, "", "", err
	}
	label, split := lib.Label(ref)
	if split != nil {
		prev, err := c.previous(ctx, req.ExecutionID, req.TeamID, ref.Name, label)
		if err != nil {
			return nil, "", "", err
		}
		v, err := compose.Choose(split, ref.Name, label, compose.Assignment{ExecutionID: req.ExecutionID, TeamID: req.TeamID, Previous: prev})
		if err != nil {
			return nil, "", "", err
		}
		ref = events.Reference{Name: ref.Name, Version: v}
		splitOf = split.String()
	}
	t, err = lib.Resolve(ref)
	return t, label, splitOf, err
}

// previous is the version the team was assigned under name and label earlier in this execution:
// the first of its records in PROMPTS that resolved through that label (0 when none). A
// prompt.failed that names the version its request was assigned counts as a prompt.composed does:
// a team whose first request failed keeps its version when the weights change after.
func (c *composer) previous(ctx context.Context, exec, team, name, label string) (int, error) {
	st, err := c.js.Stream(ctx, events.StreamPrompts)
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", events.StreamPrompts, err)
	}
	subject := events.PromptAnswerSubject(exec, team)
	seq := uint64(1)
	for range maxPrevious {
		msg, err := st.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subject))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return 0, nil
		}
		if err != nil {
			return 0, fmt.Errorf("read %s: %w", events.StreamPrompts, err)
		}
		if r, err := audit.Decode(msg.Subject, msg.Data); err == nil {
			assigned := r.Data.Template
			if r.Failed != nil {
				assigned = events.TemplateRef{}
				if r.Failed.Template != nil {
					assigned = *r.Failed.Template
				}
			}
			if assigned.Name == name && assigned.Label == label {
				return assigned.Version, nil
			}
		}
		seq = msg.Sequence + 1
	}
	return 0, nil
}
