package composer

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/internal/health"
	"github.com/podium-llm/podium/internal/retry"
	"github.com/podium-llm/podium/pkg/events"
)

// An answer that PROMPTS does not take (the stream deleted, out of storage, without a quorum) is
// never dropped: the request stays in hand, kept alive, and the publish is tried again with the
// shared backoff until it is stored or the composer stops (then the request is given back for
// redelivery, which costs a delivery but nothing else). Giving it back at once instead would spend
// the request's deliveries and, past COMPOSER_MAX_DELIVER, have the broker drop it unanswered.
// Meanwhile /readyz is 503 naming the cause, and a deleted PROMPTS is made again under
// MANAGE_STREAMS once its deletion has settled.

// promptsSettle is how long PROMPTS must have been missing before the composer makes it again: a
// stream made again while nats-server still moves the deleted one's files away loses its files
// (internal/consume says more).
const promptsSettle = time.Second

// answerStore is the state of storing answers: how many are waiting for PROMPTS, and the
// "prompts" condition, which fails naming the last cause while any does.
type answerStore struct {
	mu      sync.Mutex
	waiting int
	stored  *health.Condition
	// remake makes PROMPTS again when it is missing; nil when the operator owns the streams.
	remake func(ctx context.Context) (bool, error)
}

// failed notes that an answer is not stored, why, and whether it started waiting now.
func (a *answerStore) failed(why string, first bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if first {
		a.waiting++
	}
	a.stored.Fail("answers cannot be stored in %s (%s); their requests are held, not dropped", events.StreamPrompts, why)
}

// done notes that an answer that waited is stored, or given back.
func (a *answerStore) done() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.waiting--; a.waiting == 0 {
		a.stored.Holds()
	}
}

// store publishes an answer until PROMPTS takes it (see the top of this file), once per request
// (once.go: a request PROMPTS holds an answer of already is counted as replayed, and nothing is
// published). It returns nil once stored or found, the publish's error when the answer can never
// be stored (too large), or ctx's error.
func (c *composer) store(ctx context.Context, answerID string, publish func(context.Context) (*jetstream.PubAck, error)) error {
	a := c.answers
	var since time.Time
	var published uint64 // PROMPTS took the answer at this sequence: only the note is left to store
	for attempt := uint64(1); ; attempt++ {
		seq, replayed, err := c.publishOnce(ctx, answerID, publish, &published)
		var tooLarge *events.TooLargeError
		if err == nil || errors.As(err, &tooLarge) || ctx.Err() != nil {
			if !since.IsZero() {
				a.done()
				if err == nil {
					c.log.InfoContext(ctx, "answer stored after PROMPTS refused it", "attempts", attempt, "after", time.Since(since).Round(time.Millisecond).String())
				}
			}
			if replayed {
				c.replayed(ctx, answerID, seq)
			}
			return err
		}
		first := since.IsZero()
		if first {
			since = time.Now()
		}
		why := err.Error()
		if events.StorageFull(err) {
			why = "JetStream storage is full: " + why
		}
		a.failed(why, first)
		c.m.answerRetries.Inc()
		delay := retry.Redelivery().Backoff(attempt)
		if attempt == 1 || attempt%10 == 0 {
			c.log.WarnContext(ctx, "answer not stored in PROMPTS; the request is held and the answer tried again", "attempt", attempt, "retry_in", delay.String(), "error", err)
		}
		if a.remake != nil && time.Since(since) >= promptsSettle {
			c.remakePrompts(ctx)
		}
		if c.once.remake != nil && missing(err) && time.Since(since) >= promptsSettle {
			if err := c.once.remake(ctx); err != nil {
				c.log.WarnContext(ctx, "ANSWERED could not be made again", "error", err)
			}
		}
		if retry.Sleep(ctx, delay) != nil {
			a.done()
			return ctx.Err()
		}
	}
}

// remakePrompts makes PROMPTS again when it is missing; an operator who made it meanwhile wins.
func (c *composer) remakePrompts(ctx context.Context) {
	made, err := c.answers.remake(ctx)
	switch {
	case err != nil:
		c.log.WarnContext(ctx, "PROMPTS is missing and could not be made again", "error", err)
	case made:
		c.log.WarnContext(ctx, "PROMPTS was missing; made it again with its configuration")
	}
}
