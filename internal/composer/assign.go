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

// A request whose template is a label split between versions (pkg/compose/split.go) is given one
// of them before anything is read or rendered: the version the team was served under that label
// earlier in the execution, found in PROMPTS, or else the one its hash chooses. From then on the
// request names that version (name@V), so the reads, the render and the record all agree; the
// record says the label too.

// maxPrevious bounds the team's earlier records looked at for one served under the label: a team
// asks with one template in an execution, so the first is the one.
const maxPrevious = 16

// assign returns req with its template resolved to a version when it names a split label, and
// the label its template resolved through ("" when it names no registry label).
func (c *composer) assign(ctx context.Context, lib *compose.Library, req events.RoundRequested) (events.RoundRequested, string, error) {
	name, label, split := lib.Label(req.Template)
	if split == nil {
		return req, label, nil
	}
	prev, err := c.previous(ctx, req.ExecutionID, req.TeamID, name, label)
	if err != nil {
		return req, "", err
	}
	v, err := compose.Choose(split, name, label, compose.Assignment{ExecutionID: req.ExecutionID, TeamID: req.TeamID, Previous: prev})
	if err != nil {
		return req, "", err
	}
	req.Template = fmt.Sprintf("%s@%d", name, v)
	return req, label, nil
}

// previous is the version the team was served under name and label earlier in this execution: the
// first of its records in PROMPTS that resolved through that label (0 when none).
func (c *composer) previous(ctx context.Context, exec, team, name, label string) (int, error) {
	st, err := c.js.Stream(ctx, events.StreamPrompts)
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", events.StreamPrompts, err)
	}
	subject := events.PromptComposedSubject(exec, team)
	seq := uint64(1)
	for range maxPrevious {
		msg, err := st.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subject))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return 0, nil
		}
		if err != nil {
			return 0, fmt.Errorf("read %s: %w", events.StreamPrompts, err)
		}
		if r, err := audit.Decode(msg.Subject, msg.Data); err == nil && r.Data.Template.Name == name && r.Data.Template.Label == label {
			return r.Data.Template.Version, nil
		}
		seq = msg.Sequence + 1
	}
	return 0, nil
}
