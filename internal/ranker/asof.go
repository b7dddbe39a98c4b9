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

// asOf reads the request's as_of and wait; ok is false when it answered a bad request.
func asOf(w http.ResponseWriter, r *http.Request) (seq uint64, wait time.Duration, ok bool) {
	q := r.URL.Query()
	if q.Get("as_of") == "" {
		if q.Get("wait") != "" {
			service.WriteJSON(w, http.StatusBadRequest, service.Error{Code: "invalid_request", Message: "wait is how long to wait for as_of: give as_of too"})
			return 0, 0, false
		}
		return 0, 0, true
	}
	seq, err := strconv.ParseUint(q.Get("as_of"), 10, 64)
	if err != nil || seq == 0 {
		service.WriteJSON(w, http.StatusBadRequest, service.Error{Code: "invalid_request", Message: "as_of must be a stream sequence of EVALUATIONS (a positive integer: your last publish acknowledgement's), got " + events.Quote(q.Get("as_of"))})
		return 0, 0, false
	}
	wait = asOfWaitDefault
	if q.Get("wait") != "" {
		if wait, err = time.ParseDuration(q.Get("wait")); err != nil || wait < 0 || wait > asOfWaitMax {
			service.WriteJSON(w, http.StatusBadRequest, service.Error{Code: "invalid_request", Message: fmt.Sprintf("wait must be a duration from 0s to %s (500ms, 10s), got %s", asOfWaitMax, events.Quote(q.Get("wait")))})
			return 0, 0, false
		}
	}
	return seq, wait, true
}

// waitCommitted waits, at most wait, until every message of EVALUATIONS up to seq is committed;
// otherwise it answers: 503 not_committed (retryable, with how far the ranker is), 409 when the
// stream never held seq (made again since the publish: its sequences started over), 503
// nats_unavailable when the floor cannot be read.
func waitCommitted(ctx context.Context, w http.ResponseWriter, committed committedFunc, seq uint64, wait time.Duration) bool {
	waited, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	for {
		floor, last, err := committed(ctx)
		switch {
		case err != nil:
			service.WriteJSON(w, http.StatusServiceUnavailable, service.Error{Code: "nats_unavailable", Message: "cannot read what the ranker committed: " + err.Error()})
			return false
		case seq > last:
			service.WriteJSON(w, http.StatusConflict, service.Error{Code: "as_of_unknown",
				Message: fmt.Sprintf("EVALUATIONS' last sequence is %d: sequence %d is not of this stream (was it made again since your publish?)", last, seq)})
			return false
		case floor >= seq:
			return true
		}
		if retry.Sleep(waited, asOfPoll) != nil {
			w.Header().Set("Retry-After", "1")
			service.WriteJSON(w, http.StatusServiceUnavailable, notCommitted{Code: "not_committed", AsOf: seq, CommittedSeq: floor,
				Message: fmt.Sprintf("the ranker has committed EVALUATIONS up to sequence %d, not yet %d (waited %s): try again", floor, seq, wait)})
			return false
		}
	}
}
