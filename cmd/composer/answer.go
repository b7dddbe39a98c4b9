package main

import (
	"context"
	"strings"

	"github.com/podium-llm/podium/pkg/events"
)

// Every request gets exactly one answer, prompt.composed or prompt.failed, under an event id
// derived from the request's id alone, so the PROMPTS duplicate window keeps one of them
// whichever replica answered and however often.

func (c *composer) publishComposed(ctx context.Context, out events.PromptComposed) error {
	id := events.PromptEventID(out.RequestID)
	body, err := events.Marshal(id, c.source, events.TypePromptComposed, c.now(), out)
	if err != nil {
		return err
	}
	if _, err := events.Publish(ctx, c.js, events.PromptComposedSubject(out.ExecutionID, out.TeamID), id, body); err != nil {
		return err
	}
	// Counted for published prompts only, not for renders of POST /v1/render.
	c.m.requests.WithLabelValues("composed", "").Inc()
	c.m.promptTokens.Observe(float64(out.TokenEstimate))
	for _, t := range out.Truncated {
		c.m.truncations.WithLabelValues(t.Section).Inc()
	}
	c.log.Debug("prompt composed", "request_id", out.RequestID, "execution_id", out.ExecutionID, "team_id", out.TeamID, "round_number", out.RoundNumber, "tokens", out.TokenEstimate)
	return nil
}

// maxFailureMessage bounds the message of a prompt.failed, so the answer to any request fits in
// one message whatever the request held (an invalid one may list many problems).
const maxFailureMessage = 4096

func (c *composer) publishFailed(ctx context.Context, requestID, exec, team string, round int, f *events.Failure) error {
	id := events.PromptEventID(requestID)
	msg := f.Message
	if len(msg) > maxFailureMessage {
		msg = strings.ToValidUTF8(msg[:maxFailureMessage-len("…")], "") + "…"
	}
	data := events.PromptFailed{RequestID: requestID, ExecutionID: exec, TeamID: team, RoundNumber: round,
		Code: f.Code, Message: msg, Retryable: f.Retryable}
	body, err := events.Marshal(id, c.source, events.TypePromptFailed, c.now(), data)
	if err != nil {
		return err
	}
	if _, err := events.Publish(ctx, c.js, events.PromptFailedSubject(exec, team), id, body); err != nil {
		return err
	}
	c.m.requests.WithLabelValues("failed", string(f.Code)).Inc()
	c.log.Info("prompt failed", "request_id", requestID, "execution_id", exec, "team_id", team, "round_number", round, "code", f.Code, "message", f.Message)
	return nil
}
