package ranker

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/internal/retry"
	"github.com/podium-llm/podium/internal/service"
	"github.com/podium-llm/podium/pkg/events"
)

// The board as of a sequence: an orchestrator that published evaluations passes the stream
// sequence of its last publish acknowledgement (as_of), and the leaderboard is read once the
// ranker's durable has acknowledged every message of EVALUATIONS up to it. The ranker
// acknowledges a message only once ClickHouse holds what it means (or it was a replay, which
// changes nothing, or a dead letter), so the board read then counts every evaluation up to that
// sequence, replays included; the board's own evaluations_seq does not move on a replay and
// cannot be waited on.

// committedFunc reads the ranker's durable's ack floor and EVALUATIONS' last sequence.
type committedFunc func(ctx context.Context) (floor, last uint64, err error)

// committedOf reads them from the server: the floor is the durable's, shared by every replica.
func committedOf(js jetstream.JetStream) committedFunc {
	return func(ctx context.Context) (uint64, uint64, error) {
		c, err := js.Consumer(ctx, events.StreamEvaluations, events.ConsumerRanker)
		if err != nil {
			return 0, 0, fmt.Errorf("the ranker's consumer: %w", err)
		}
		st, err := js.Stream(ctx, events.StreamEvaluations)
		if err != nil {
			return 0, 0, fmt.Errorf("stream %s: %w", events.StreamEvaluations, err)
		}
		return c.CachedInfo().AckFloor.Stream, st.CachedInfo().State.LastSeq, nil
	}
}

// asOfWait bounds how long a read as of a sequence waits: asked with wait, 5 s by default.
const (
	asOfWaitDefault = 5 * time.Second
	asOfWaitMax     = 60 * time.Second
	asOfPoll        = 50 * time.Millisecond
)

// notCommitted is the retryable answer of a read whose sequence is not committed yet.
type notCommitted struct {
	Code         string `json:"code"`
	Message      string `json:"message"`
	AsOf         uint64 `json:"as_of"`
	CommittedSeq uint64 `json:"committed_seq"`
}

// parseAsOf reads a request's as_of and wait (HTTP query values, or the NATS request's fields as
// text); a bad one is answered.
func parseAsOf(asOf, waitText string) (seq uint64, wait time.Duration, bad *answer) {
	if asOf == "" {
		if waitText != "" {
			return 0, 0, &answer{status: http.StatusBadRequest, body: service.Error{Code: "invalid_request", Message: "wait is how long to wait for as_of: give as_of too"}}
		}
		return 0, 0, nil
	}
	seq, err := strconv.ParseUint(asOf, 10, 64)
	if err != nil || seq == 0 {
		return 0, 0, &answer{status: http.StatusBadRequest, body: service.Error{Code: "invalid_request", Message: "as_of must be a stream sequence of EVALUATIONS (a positive integer: your last publish acknowledgement's), got " + events.Quote(asOf)}}
	}
	wait = asOfWaitDefault
	if waitText != "" {
		if wait, err = time.ParseDuration(waitText); err != nil || wait < 0 || wait > asOfWaitMax {
			return 0, 0, &answer{status: http.StatusBadRequest, body: service.Error{Code: "invalid_request", Message: fmt.Sprintf("wait must be a duration from 0s to %s (500ms, 10s), got %s", asOfWaitMax, events.Quote(waitText))}}
		}
	}
	return seq, wait, nil
}

// waitCommitted waits, at most wait, until every message of EVALUATIONS up to seq is committed
// (nil); otherwise it is answered: 503 not_committed (retryable, with how far the ranker is), 409
// when the stream never held seq (made again since the publish: its sequences started over), 503
// nats_unavailable when the floor cannot be read.
func waitCommitted(ctx context.Context, committed committedFunc, seq uint64, wait time.Duration) *answer {
	waited, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	for {
		floor, last, err := committed(ctx)
		switch {
		case err != nil:
			return &answer{status: http.StatusServiceUnavailable, body: service.Error{Code: "nats_unavailable", Message: "cannot read what the ranker committed: " + err.Error()}}
		case seq > last:
			return &answer{status: http.StatusConflict, body: service.Error{Code: "as_of_unknown",
				Message: fmt.Sprintf("EVALUATIONS' last sequence is %d: sequence %d is not of this stream (was it made again since your publish?)", last, seq)}}
		case floor >= seq:
			return nil
		}
		if retry.Sleep(waited, asOfPoll) != nil {
			return &answer{status: http.StatusServiceUnavailable, retryAfter: true, body: notCommitted{Code: "not_committed", AsOf: seq, CommittedSeq: floor,
				Message: fmt.Sprintf("the ranker has committed EVALUATIONS up to sequence %d, not yet %d (waited %s): try again", floor, seq, wait)}}
		}
	}
}
