// Package client is a Go client of Podium's contract for orchestrators (docs/orchestrators.md):
// events checked as the services check them, published under their id until JetStream
// acknowledges them, a request published and its one answer waited for, and the leaderboard read
// as of the orchestrator's own evaluations. It holds the rules an orchestrator would otherwise
// write again; what to do with a failure stays the caller's.
//
// Another module imports it as github.com/podium-llm/podium/pkg/client; while that path is not
// published, add `replace github.com/podium-llm/podium => <path to this repository>` to its go.mod.
package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/internal/retry"
	"github.com/podium-llm/podium/pkg/events"
)

// Options configure a client.
type Options struct {
	// Source is the CloudEvents source of what the client publishes: "orchestrator/<name>".
	Source string
	// RankerURL is the ranker's HTTP address (http://host:8082), for Board; empty: Board asks over
	// NATS (podium.leaderboard), needing no address and no token.
	RankerURL string
	// RankerToken is RANKER_API_TOKEN, where the ranker is reached beyond loopback.
	RankerToken string
	// MaxEventBytes is the services' MAX_EVENT_BYTES (0: events.DefaultMaxEventBytes).
	MaxEventBytes int
}

// Client publishes an orchestrator's events and reads its answers.
type Client struct {
	js   jetstream.JetStream
	o    Options
	http *http.Client
}

// New is a client over a NATS connection of the orchestrator's user.
func New(nc *nats.Conn, o Options) (*Client, error) {
	if o.Source == "" {
		return nil, errors.New("client: Options.Source is required (orchestrator/<name>)")
	}
	if o.MaxEventBytes == 0 {
		o.MaxEventBytes = events.DefaultMaxEventBytes
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	return &Client{js: js, o: o, http: &http.Client{Timeout: 90 * time.Second}}, nil
}

// ID is an event id made from what the event is (an execution, a team, a round, an attempt): the
// same parts give the same id after a restart, and ids made of 128-character parts stay within
// the contract's 128 characters.
func ID(kind string, parts ...string) string { return events.DerivedID(kind, parts...) }

// PublishEvaluation checks an evaluation as the ranker will and publishes it under id until
// JetStream acknowledges it (every try under the same id: a try that was stored but whose
// acknowledgement was lost is not stored twice). It returns the acknowledgement's sequence: what
// Board reads the leaderboard as of.
func (c *Client) PublishEvaluation(ctx context.Context, id string, at time.Time, ev events.EvaluationCompleted) (uint64, error) {
	return c.publish(ctx, events.EvaluationSubject(ev.ExecutionID, ev.TeamID), id, events.TypeEvaluationCompleted, at, ev)
}

// publish checks the event (events.Validate, the services' own check) and publishes it until
// acknowledged or ctx ends.
func (c *Client) publish(ctx context.Context, subject, id, eventType string, at time.Time, data any) (uint64, error) {
	body, err := events.Marshal(id, c.o.Source, eventType, at, data)
	if err != nil {
		return 0, fmt.Errorf("client: %s %s: %w", eventType, id, err)
	}
	if err := events.Validate(subject, body, c.o.MaxEventBytes); err != nil {
		return 0, fmt.Errorf("client: %s %s: %w", eventType, id, err)
	}
	for attempt := uint64(1); ; attempt++ {
		tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		ack, err := events.Publish(tctx, c.js, subject, id, body)
		cancel()
		if err == nil {
			return ack.Sequence, nil
		}
		var tooLarge *events.TooLargeError
		if errors.As(err, &tooLarge) {
			return 0, fmt.Errorf("client: %s %s: %w", eventType, id, err)
		}
		if retry.Sleep(ctx, retry.Redelivery().Backoff(attempt)) != nil {
			return 0, fmt.Errorf("client: %s %s not acknowledged: %w (last try: %v)", eventType, id, ctx.Err(), err)
		}
	}
}

// Failed is a request's prompt.failed answer. Retryable ones arrive only after the composer
// retried them COMPOSER_MAX_DELIVER times; either way the request's id is answered for ever, so
// a new attempt is a new request id (docs/orchestrators.md, "Every answer").
type Failed struct {
	events.PromptFailed
}

func (f *Failed) Error() string {
	return fmt.Sprintf("request %s failed: %s: %s (retryable %v)", f.RequestID, f.Code, f.Message, f.Retryable)
}

// RequestPrompt publishes a request under id and waits, while ctx lasts, for its one answer: the
// composed prompt, or a *Failed. It follows PROMPTS with an ordered consumer started before the
// publish (which the client makes again if another role deletes or disturbs it), and looks the
// answer up in ANSWERED first, so a request answered before (an orchestrator that restarted and
// asks again under the same id) gets its answer. Publishing again under the same id is always
// safe; never publish under a new id because nothing came yet.
func (c *Client) RequestPrompt(ctx context.Context, id string, at time.Time, req events.RoundRequested) (events.PromptComposed, error) {
	stream, err := c.js.Stream(ctx, events.StreamPrompts)
	if err != nil {
		return events.PromptComposed{}, fmt.Errorf("client: stream %s: %w", events.StreamPrompts, err)
	}
	cons, err := c.js.OrderedConsumer(ctx, events.StreamPrompts, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{events.PromptAnswerSubject(req.ExecutionID, req.TeamID)},
		DeliverPolicy:  jetstream.DeliverByStartSequencePolicy, OptStartSeq: stream.CachedInfo().State.LastSeq + 1})
	if err != nil {
		return events.PromptComposed{}, fmt.Errorf("client: follow %s: %w", events.StreamPrompts, err)
	}
	answers, err := cons.Messages()
	if err != nil {
		return events.PromptComposed{}, fmt.Errorf("client: follow %s: %w", events.StreamPrompts, err)
	}
	defer answers.Stop()
	if body, ok := c.answered(ctx, id); ok {
		return answerOf(id, body)
	}
	if _, err := c.publish(ctx, events.RoundSubject(req.ExecutionID, req.TeamID), id, events.TypeRoundRequested, at, req); err != nil {
		return events.PromptComposed{}, err
	}
	got := make(chan []byte, 1)
	go func() {
		defer close(got)
		for {
			m, err := answers.Next()
			if err != nil {
				return // stopped: ctx ended
			}
			if env, err := decode(m.Data()); err == nil && requestOf(env) == id {
				got <- m.Data()
				return
			}
		}
	}()
	// An answer published before the follower started (an earlier try of this request, by a
	// process that restarted) is found in ANSWERED once its note is written.
	again := time.NewTicker(answeredEvery)
	defer again.Stop()
	for {
		select {
		case body, ok := <-got:
			if !ok {
				return events.PromptComposed{}, fmt.Errorf("client: the follower of %s ended", events.StreamPrompts)
			}
			return answerOf(id, body)
		case <-again.C:
			if body, ok := c.answered(ctx, id); ok {
				return answerOf(id, body)
			}
		case <-ctx.Done():
			return events.PromptComposed{}, fmt.Errorf("client: no answer to request %s yet: %w (publish it again under the same id, never a new one)", id, ctx.Err())
		}
	}
}

// answeredEvery is how often a request waiting for its answer looks it up in ANSWERED too.
const answeredEvery = 2 * time.Second

// answered is the answer ANSWERED notes for request id, read from PROMPTS at its sequence.
func (c *Client) answered(ctx context.Context, id string) ([]byte, bool) {
	kv, err := c.js.KeyValue(ctx, events.BucketAnswered)
	if err != nil {
		return nil, false
	}
	e, err := kv.Get(ctx, events.PromptEventID(id))
	if err != nil {
		return nil, false
	}
	var note events.Answered
	if json.Unmarshal(e.Value(), &note) != nil {
		return nil, false
	}
	stream, err := c.js.Stream(ctx, events.StreamPrompts)
	if err != nil {
		return nil, false
	}
	m, err := stream.GetMsg(ctx, note.PromptsSeq)
	if err != nil || m.Header.Get(jetstream.MsgIDHeader) != events.PromptEventID(id) {
		return nil, false // a note that no longer names the answer (PROMPTS trimmed or made again)
	}
	return m.Data, true
}

// decode reads an answer's envelope.
func decode(body []byte) (events.Envelope, error) {
	var env events.Envelope
	err := json.Unmarshal(body, &env)
	return env, err
}

// requestOf is the request id an answer's data names.
func requestOf(env events.Envelope) string {
	var d struct {
		RequestID string `json:"request_id"`
	}
	_ = json.Unmarshal(env.Data, &d)
	return d.RequestID
}

// answerOf is request id's answer: the composed prompt, or a *Failed.
func answerOf(id string, body []byte) (events.PromptComposed, error) {
	env, err := decode(body)
	if err != nil {
		return events.PromptComposed{}, fmt.Errorf("client: the answer to %s: %w", id, err)
	}
	switch env.Type {
	case events.TypePromptComposed:
		var pc events.PromptComposed
		if err := json.Unmarshal(env.Data, &pc); err != nil {
			return events.PromptComposed{}, fmt.Errorf("client: the answer to %s: %w", id, err)
		}
		return pc, nil
	case events.TypePromptFailed:
		var f Failed
		if err := json.Unmarshal(env.Data, &f.PromptFailed); err != nil {
			return events.PromptComposed{}, fmt.Errorf("client: the answer to %s: %w", id, err)
		}
		return events.PromptComposed{}, &f
	}
	return events.PromptComposed{}, fmt.Errorf("client: the answer to %s is of type %s", id, events.Quote(env.Type))
}

// Board is the ranker's leaderboard of an execution (schemas/api/leaderboard.schema.json).
type Board struct {
	ExecutionID    string                  `json:"execution_id"`
	Teams          []events.LeaderboardRow `json:"teams"`
	EvaluationsSeq uint64                  `json:"evaluations_seq"`
	EvaluationsEra uint32                  `json:"evaluations_era,omitempty"`
	AsOf           uint64                  `json:"as_of,omitempty"`
}

// apiError is the ranker's error body.
type apiError struct {
	Code         string `json:"code"`
	Message      string `json:"message"`
	CommittedSeq uint64 `json:"committed_seq"`
}

// Board reads the leaderboard of exec as of asOf, the sequence PublishEvaluation returned for the
// last evaluation (0: as it is now), asking again while the ranker answers that it has not
// committed so far yet or is refilling, until ctx ends.
func (c *Client) Board(ctx context.Context, exec string, asOf uint64) (Board, error) {
	read := func(ctx context.Context) (Board, bool, error) { return c.boardOverNATS(ctx, exec, asOf) }
	if c.o.RankerURL != "" {
		q := url.Values{}
		if asOf > 0 {
			q.Set("as_of", strconv.FormatUint(asOf, 10))
			q.Set("wait", "10s")
		}
		u := c.o.RankerURL + "/v1/executions/" + url.PathEscape(exec) + "/leaderboard?" + q.Encode()
		read = func(ctx context.Context) (Board, bool, error) { return c.board(ctx, u) }
	}
	for attempt := uint64(1); ; attempt++ {
		b, retryable, err := read(ctx)
		if err == nil || !retryable {
			return b, err
		}
		if retry.Sleep(ctx, retry.Redelivery().Backoff(attempt)) != nil {
			return Board{}, fmt.Errorf("%w (%v)", err, ctx.Err())
		}
	}
}

// boardOverNATS is one read over NATS (podium.leaderboard, the same answer as the HTTP read's);
// retryable says whether asking again may answer.
func (c *Client) boardOverNATS(ctx context.Context, exec string, asOf uint64) (Board, bool, error) {
	req := map[string]any{"execution_id": exec}
	if asOf > 0 {
		req["as_of"], req["wait"] = asOf, "10s"
	}
	data, err := json.Marshal(req)
	if err != nil {
		return Board{}, false, err
	}
	rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	msg, err := c.js.Conn().RequestWithContext(rctx, "podium.leaderboard", data)
	if err != nil {
		return Board{}, true, fmt.Errorf("client: leaderboard over NATS: %w", err)
	}
	if code := msg.Header.Get("Nats-Service-Error-Code"); code != "" {
		var e apiError
		_ = json.Unmarshal(msg.Data, &e)
		return Board{}, code == strconv.Itoa(http.StatusServiceUnavailable), fmt.Errorf("client: leaderboard: %s %s: %s", code, e.Code, e.Message)
	}
	var b Board
	if err := json.Unmarshal(msg.Data, &b); err != nil {
		return Board{}, false, fmt.Errorf("client: leaderboard: %w", err)
	}
	return b, false, nil
}

// board is one read; retryable says whether asking again may answer.
func (c *Client) board(ctx context.Context, u string) (Board, bool, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return Board{}, false, err
	}
	if c.o.RankerToken != "" {
		req.Header.Set("Authorization", "Bearer "+c.o.RankerToken)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return Board{}, true, fmt.Errorf("client: leaderboard: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return Board{}, true, fmt.Errorf("client: leaderboard: %w", err)
	}
	if resp.StatusCode == http.StatusOK {
		var b Board
		if err := json.Unmarshal(body, &b); err != nil {
			return Board{}, false, fmt.Errorf("client: leaderboard: %w", err)
		}
		return b, false, nil
	}
	var e apiError
	_ = json.Unmarshal(body, &e)
	err = fmt.Errorf("client: leaderboard: %d %s: %s", resp.StatusCode, e.Code, e.Message)
	return Board{}, resp.StatusCode == http.StatusServiceUnavailable, err
}
