package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/pkg/compose"
	"github.com/podium-llm/podium/pkg/events"
)

// composer answers round requests.
type composer struct {
	log           *slog.Logger
	js            jetstream.JetStream
	probes        *commitProbes
	reads         *storeReads
	lib           *compose.Library
	m             *metrics
	source        string
	maxBytes      int
	inputsTimeout time.Duration
	maxDeliver    int
	now           func() time.Time

	consuming atomic.Bool
}

// failure is a request that ends in prompt.failed.
type failure struct {
	code      events.FailureCode
	msg       string
	retryable bool
}

func (f *failure) Error() string { return string(f.code) + ": " + f.msg }

// errStore marks a ClickHouse failure: worth retrying by redelivery before giving up.
var errStore = errors.New("store unavailable")

// consume runs workers until stop is done; each finishes the request in hand under work.
func (c *composer) consume(stop, work context.Context, cons jetstream.Consumer, workers int) error {
	// A buffer the size of the worker pool: replicas sharing the durable must not hoard
	// requests they cannot start before AckWait (nats.go#1929).
	it, err := cons.Messages(jetstream.PullMaxMessages(workers))
	if err != nil {
		return fmt.Errorf("composer: consume: %w", err)
	}
	c.consuming.Store(true)
	defer c.consuming.Store(false)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				msg, err := it.Next()
				if err != nil {
					if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
						return
					}
					c.log.Warn("fetch failed", "error", err)
					continue
				}
				c.handle(work, msg)
			}
		}()
	}
	<-stop.Done()
	// Drain: no new pulls; requests already delivered to this client are still answered.
	it.Drain()
	wg.Wait()
	return nil
}

// handle answers one request and settles the message.
func (c *composer) handle(ctx context.Context, msg jetstream.Msg) {
	md, err := msg.Metadata()
	if err != nil {
		c.log.Error("message without metadata", "subject", msg.Subject(), "error", err)
		_ = msg.Term()
		return
	}
	req, err := events.ParseRoundRequest(msg.Subject(), msg.Data(), c.maxBytes)
	if err != nil {
		c.reject(ctx, msg, md, req, err)
		return
	}
	out, err := c.compose(ctx, req.ID, req.Data, req.Time, func() { _ = msg.InProgress() })
	if err == nil {
		if err := c.publishComposed(ctx, out); err != nil {
			c.retryLater(msg, md, err)
			return
		}
		// Counted for published prompts only, not for renders of POST /v1/render.
		c.m.requests.WithLabelValues("composed", "").Inc()
		c.m.promptTokens.Observe(float64(out.TokenEstimate))
		for _, t := range out.Truncated {
			c.m.truncations.WithLabelValues(t.Section).Inc()
		}
		c.log.Debug("prompt composed", "request_id", req.ID, "execution_id", out.ExecutionID, "team_id", out.TeamID, "round_number", out.RoundNumber, "tokens", out.TokenEstimate)
	} else {
		if ctx.Err() != nil {
			// Shutting down past the timeout: leave the request to another replica.
			_ = msg.Nak()
			return
		}
		var f *failure
		switch {
		case errors.As(err, &f):
		case errors.Is(err, errStore) && int(md.NumDelivered) < c.maxDeliver:
			c.log.Warn("store unavailable; request will be redelivered", "request_id", req.ID, "delivery", md.NumDelivered, "error", err)
			_ = msg.NakWithDelay(backoff(md.NumDelivered))
			return
		case errors.Is(err, errStore):
			f = &failure{code: events.CodeStoreUnavailable, msg: err.Error(), retryable: true}
		default:
			f = &failure{code: events.CodeTemplateError, msg: err.Error()}
		}
		if err := c.publishFailed(ctx, req.ID, req.Data.ExecutionID, req.Data.TeamID, req.Data.RoundNumber, f); err != nil {
			c.retryLater(msg, md, err)
			return
		}
	}
	if err := msg.Ack(); err != nil {
		// The answer is published under an id derived from the request: a redelivery is deduplicated.
		c.log.Warn("ack failed", "request_id", req.ID, "error", err)
	}
}

// reject dead-letters a request that can never be processed and, when the subject still names an
// execution and a team, answers it with prompt.failed invalid_request.
func (c *composer) reject(ctx context.Context, msg jetstream.Msg, md *jetstream.MsgMetadata, req events.RoundRequest, cause error) {
	if err := events.DeadLetter(ctx, c.js, msg, cause.Error()); err != nil {
		c.retryLater(msg, md, err)
		return
	}
	c.m.requests.WithLabelValues("dead_lettered", string(events.CodeInvalidRequest)).Inc()
	c.log.Warn("dead-lettered invalid request", "subject", msg.Subject(), "stream_seq", md.Sequence.Stream, "reason", cause.Error())
	if addr, err := events.ParseTeamSubject(events.TypeRoundRequested, msg.Subject()); err == nil {
		requestID := req.ID
		if !events.ValidEventID(requestID) {
			// Too broken to carry an id: the stream position names it uniquely and stably.
			requestID = md.Stream + "-" + strconv.FormatUint(md.Sequence.Stream, 10)
		}
		f := &failure{code: events.CodeInvalidRequest, msg: cause.Error()}
		if err := c.publishFailed(ctx, requestID, addr.ExecutionID, addr.TeamID, req.Data.RoundNumber, f); err != nil {
			c.retryLater(msg, md, err)
			return
		}
	}
	_ = msg.TermWithReason("invalid request")
}

// retryLater hands a message back after a NATS failure while answering it.
func (c *composer) retryLater(msg jetstream.Msg, md *jetstream.MsgMetadata, err error) {
	c.log.Warn("could not answer request; will retry", "subject", msg.Subject(), "delivery", md.NumDelivered, "error", err)
	_ = msg.NakWithDelay(backoff(md.NumDelivered))
}

func backoff(delivery uint64) time.Duration {
	d := 250 * time.Millisecond << min(delivery, 5)
	return min(d, 5*time.Second)
}

// compose builds the prompt.composed data of a request: read-your-writes wait, store reads,
// render. keepAlive is called while waiting so the broker does not redeliver the request.
func (c *composer) compose(ctx context.Context, requestID string, req events.RoundRequested, at time.Time, keepAlive func()) (events.PromptComposed, error) {
	waitStart := time.Now()
	seq, err := c.waitForInputs(ctx, keepAlive)
	if err != nil {
		return events.PromptComposed{}, err
	}
	c.m.inputsWait.Observe(time.Since(waitStart).Seconds())

	// One read of the execution serves the history and the leaderboard, and is shared with the
	// other teams' requests of the same round.
	evs, err := c.reads.get(ctx, req.ExecutionID, seq)
	if err != nil {
		if ctx.Err() != nil {
			return events.PromptComposed{}, err
		}
		return events.PromptComposed{}, fmt.Errorf("%w: %v", errStore, err)
	}
	order := req.ScoreOrder
	if order == "" {
		order = events.Desc
	}
	sn := evs.Before(req.RoundNumber)
	history := sn.History(req.TeamID)
	board := sn.Leaderboard(order)

	renderStart := time.Now()
	out, err := c.lib.Compose(compose.Inputs{
		RequestID:      requestID,
		Request:        req,
		Time:           at,
		History:        history,
		Leaderboard:    board.Rows,
		EvaluationsSeq: board.Seq,
	})
	c.m.renderDuration.Observe(time.Since(renderStart).Seconds())
	if err != nil {
		return events.PromptComposed{}, &failure{code: compose.Code(err), msg: err.Error()}
	}
	if out.Template.Fallback {
		c.log.Warn("model variant failed; composed with the base template", "request_id", requestID, "template", out.Template.Name, "variant", out.Template.Variant, "model", req.Model)
	}
	return out, nil
}

// waitForInputs implements CONTRACT section 5: every evaluation JetStream acknowledged before
// now must be committed by the ranker (its ack floor reaches the stream's last sequence). It
// returns that sequence, 0 when no evaluation was ever accepted.
func (c *composer) waitForInputs(ctx context.Context, keepAlive func()) (uint64, error) {
	ctx, cancel := context.WithTimeout(ctx, c.inputsTimeout)
	defer cancel()
	detail := "no answer from JetStream"
	notReady := func() error {
		return &failure{code: events.CodeInputsNotReady, retryable: true,
			msg: fmt.Sprintf("the ranker has not committed the evaluations acknowledged before this request within %s (%s)", c.inputsTimeout, detail)}
	}
	var target uint64
	known := false
	delay := 5 * time.Millisecond
	lastKeepAlive := time.Now()
	for {
		p, err := c.probes.join(ctx)
		if err != nil {
			return 0, notReady()
		}
		if !known {
			if p.noStream {
				return 0, nil // no evaluation was ever accepted: nothing to wait for
			}
			if p.streamErr == nil {
				// The first probe that read the stream started after this request was taken:
				// the stream's last sequence then is what the ranker must reach.
				target, known = p.lastSeq, true
				if target == 0 {
					return 0, nil
				}
			}
		}
		// Until the target is known the probe failed on the stream, and committed says so.
		ok, why := p.committed(target)
		if ok {
			return target, nil
		}
		detail = why
		if time.Since(lastKeepAlive) > 5*time.Second {
			keepAlive()
			lastKeepAlive = time.Now()
		}
		select {
		case <-ctx.Done():
			return 0, notReady()
		case <-time.After(delay):
		}
		delay = min(delay*2, 100*time.Millisecond)
	}
}

func (c *composer) publishComposed(ctx context.Context, out events.PromptComposed) error {
	id := events.PromptEventID(out.RequestID)
	body, err := events.Marshal(id, c.source, events.TypePromptComposed, c.now(), out)
	if err != nil {
		return err
	}
	_, err = events.Publish(ctx, c.js, events.PromptComposedSubject(out.ExecutionID, out.TeamID), id, body)
	return err
}

func (c *composer) publishFailed(ctx context.Context, requestID, exec, team string, round int, f *failure) error {
	id := events.PromptEventID(requestID)
	data := events.PromptFailed{RequestID: requestID, ExecutionID: exec, TeamID: team, RoundNumber: round,
		Code: f.code, Message: f.msg, Retryable: f.retryable}
	body, err := events.Marshal(id, c.source, events.TypePromptFailed, c.now(), data)
	if err != nil {
		return err
	}
	if _, err := events.Publish(ctx, c.js, events.PromptFailedSubject(exec, team), id, body); err != nil {
		return err
	}
	c.m.requests.WithLabelValues("failed", string(f.code)).Inc()
	c.log.Info("prompt failed", "request_id", requestID, "execution_id", exec, "team_id", team, "round_number", round, "code", f.code, "message", f.msg)
	return nil
}
