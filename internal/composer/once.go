package composer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/pkg/events"
)

// One answer per request, for as long as PROMPTS keeps it (docs/contract.md#one-answer-per-request).
//
// PROMPTS' duplicate window stores one answer of a request however many replicas publish one
// within ten minutes; a request replayed later (an orchestrator that restarts and publishes its
// pending requests again under their ids) would be answered a second time, from newer inputs.
// ANSWERED closes that: once PROMPTS took an answer, the composer notes it there (key: the
// answer's event id; value: its PROMPTS sequence) before it acknowledges the request, and every
// answer is looked up there before it is published (not before it is composed: a replay is rare,
// and a lookup there would cost every request). A request noted there is acknowledged
// without a second answer.
//
// Why nothing falls between the two: an answer is noted after PROMPTS took it and before its
// request is acknowledged. A composer that dies in between leaves the request to be delivered
// again after COMPOSER_ACK_WAIT, well inside the duplicate window, and that delivery's publish is
// a duplicate whose acknowledgement names the first answer's sequence, which it notes. Two
// replicas that meet the same request at once both publish inside the window: PROMPTS keeps the
// first and both note its sequence. A note is trusted only while PROMPTS holds the answer it names
// (lookup), and an answer published is noted until the note is stored, never published again.
//
// The bucket keeps a key as long as PROMPTS keeps a record (its max age, for ever by default): a
// request replayed after its answer left PROMPTS is a new request.

// answered is the composer's view of events.BucketAnswered.
type answered struct {
	kv jetstream.KeyValue
	js jetstream.JetStream // PROMPTS, where a note is checked
	// remake makes the bucket again when it is missing (an operator deleted it); nil when the
	// operator owns the streams. What it held is gone: replays of requests answered before are
	// then answered again once their duplicate window has passed.
	remake func(ctx context.Context) error
}

// errAnswered marks a failure to read or write ANSWERED: the answer is held and tried again, as
// when PROMPTS does not take it (store.go).
var errAnswered = errors.New(events.BucketAnswered)

// lookup says whether PROMPTS holds an answer of the request whose answer is answerID, and its
// sequence there. A note is taken only when PROMPTS still holds that answer at its sequence: a
// note outlives its record when PROMPTS was trimmed by bytes, or deleted and made again (its
// sequences start over), and a key written by anything but a composer names nothing; the request
// is then answered as a new one.
func (a *answered) lookup(ctx context.Context, answerID string) (uint64, bool, error) {
	e, err := a.kv.Get(ctx, answerID)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("%w: read %s: %w", errAnswered, answerID, err)
	}
	var v events.Answered
	if err := json.Unmarshal(e.Value(), &v); err != nil || v.PromptsSeq == 0 {
		return 0, false, nil
	}
	st, err := a.js.Stream(ctx, events.StreamPrompts)
	if err != nil {
		return 0, false, fmt.Errorf("check the note of %s in %s: %w", answerID, events.StreamPrompts, err)
	}
	msg, err := st.GetMsg(ctx, v.PromptsSeq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("check the note of %s in %s: %w", answerID, events.StreamPrompts, err)
	}
	if msg.Header.Get(jetstream.MsgIDHeader) != answerID {
		return 0, false, nil
	}
	return v.PromptsSeq, true, nil
}

// note records that PROMPTS holds the request's answer at seq, over a note that no longer holds
// (lookup); replicas that answered at once note the same sequence (PROMPTS kept one answer).
func (a *answered) note(ctx context.Context, answerID string, seq uint64) error {
	body, err := json.Marshal(events.Answered{PromptsSeq: seq})
	if err != nil {
		return err
	}
	if _, err := a.kv.Put(ctx, answerID, body); err != nil {
		return fmt.Errorf("%w: note %s: %w", errAnswered, answerID, err) // the cause kept: storage full is said as such
	}
	return nil
}

// missing says whether err is ANSWERED gone (then it is made again, under MANAGE_STREAMS).
func missing(err error) bool {
	return errors.Is(err, errAnswered) && (errors.Is(err, jetstream.ErrBucketNotFound) || errors.Is(err, jetstream.ErrStreamNotFound) ||
		strings.Contains(err.Error(), "stream not found") || strings.Contains(err.Error(), "no responders"))
}

// publishOnce stores an answer unless PROMPTS holds one of its request already: it returns the
// sequence of the answer PROMPTS holds, and whether it was there before (a replay). published
// carries, across the tries of store, the sequence PROMPTS took this answer at: once published, a
// try only notes it, so a note that fails for longer than the duplicate window never publishes a
// second answer.
func (c *composer) publishOnce(ctx context.Context, answerID string, publish func(context.Context) (*jetstream.PubAck, error), published *uint64) (uint64, bool, error) {
	if *published == 0 {
		if seq, ok, err := c.once.lookup(ctx, answerID); err != nil || ok {
			return seq, ok, err
		}
		ack, err := publish(ctx)
		if err != nil {
			return 0, false, err
		}
		*published = ack.Sequence
	}
	return *published, false, c.once.note(ctx, answerID, *published)
}

// replayed counts a request that PROMPTS holds an answer of already, and says where.
func (c *composer) replayed(ctx context.Context, answerID string, seq uint64) {
	c.m.requests.WithLabelValues("replayed", "").Inc()
	c.log.InfoContext(ctx, "request answered before; no second answer", "answer_id", answerID, "prompts_seq", seq)
}
