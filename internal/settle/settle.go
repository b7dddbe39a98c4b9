// Package settle is the one place where a consumed JetStream message is settled. Business steps
// return an Outcome (done, retry later, poison with a reason); Settler maps it to Ack,
// NakWithDelay with the one shared Backoff, or dead letter + Term, and counts it. Handlers never
// call Ack, Nak or Term themselves, as in watermill's handler/middleware split.
package settle

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/podium-llm/podium/internal/retry"
	"github.com/podium-llm/podium/internal/series"
	"github.com/podium-llm/podium/pkg/events"
)

// Kind is what became of a message.
type Kind int

const (
	// Done: the message is handled (stored, answered); acknowledge it.
	Done Kind = iota
	// Retry: a transient failure (NATS, ClickHouse, shutdown); redeliver it after Backoff.
	Retry
	// Poison: the message can never be handled; dead-letter it with the reason and terminate it.
	Poison
)

var kindNames = [...]string{Done: "done", Retry: "retry", Poison: "dead_lettered"}

func (k Kind) String() string { return kindNames[k] }

// Outcome is what a handler decided about one message.
type Outcome struct {
	Kind Kind
	// Why explains Retry (logged) and Poison (the dead letter's Dead-Reason).
	Why string
}

// Ack is the outcome of a handled message.
func Ack() Outcome { return Outcome{Kind: Done} }

// RetryLater is the outcome of a transient failure.
func RetryLater(err error) Outcome { return Outcome{Kind: Retry, Why: err.Error()} }

// Reject is the outcome of a message that can never be handled.
func Reject(reason string) Outcome { return Outcome{Kind: Poison, Why: reason} }

// deadLetterTries is how often a dead letter is tried before the poison message is terminated
// anyway: a poison message must never hold the consumer's ack floor.
const deadLetterTries = 3

// Settler settles the messages of one service.
type Settler struct {
	js      jetstream.JetStream
	log     *slog.Logger
	settled *prometheus.CounterVec
	lost    prometheus.Counter
}

// New builds the settler of a service; its metrics are <service>_messages_settled_total{outcome}
// and <service>_dead_letters_failed_total.
func New(js jetstream.JetStream, log *slog.Logger, reg prometheus.Registerer, service string) *Settler {
	f := series.On(reg).Under(service)
	return &Settler{
		js:      js,
		log:     log,
		settled: f.CounterVec("messages_settled_total", "Consumed messages by how they were settled: done (acked), retry (nak'ed with backoff), dead_lettered (copied to DEADLETTER and terminated).", "outcome"),
		lost:    f.Counter("dead_letters_failed_total", "Poison messages terminated without a dead letter because publishing it kept failing (see the error log)."),
	}
}

// Settle acts on o for msg. It never blocks on a dead letter for longer than its tries.
func (s *Settler) Settle(ctx context.Context, msg jetstream.Msg, o Outcome) {
	s.settled.WithLabelValues(o.Kind.String()).Inc()
	switch o.Kind {
	case Done:
		// A batch whose acks must be confirmed goes through AckAll.
		if err := msg.Ack(); err != nil {
			// Every sink is idempotent, so a redelivery of a handled message changes nothing.
			s.log.WarnContext(ctx, "ack failed", "subject", msg.Subject(), "error", err)
		}
	case Retry:
		delivery := uint64(1)
		if md, err := msg.Metadata(); err == nil {
			delivery = md.NumDelivered
		}
		s.log.WarnContext(ctx, "message will be redelivered", "subject", msg.Subject(), "delivery", delivery, "error", o.Why)
		_ = msg.NakWithDelay(retry.Redelivery().Backoff(delivery))
	case Poison:
		s.deadLetter(ctx, msg, o.Why)
		_ = msg.TermWithReason("invalid event")
	}
}

// AckAll acknowledges msgs, all handled, and returns once the server confirmed the last: then
// every earlier ack of the same consumer on the same connection is applied too (the ack floor
// shows them). An ack sent just before a NATS restart can be lost while the client takes it as
// sent, and only the failing confirmation says so: then every ack is sent again, raw (the client
// refuses a second ack of a message), and confirmed again, with the shared backoff, until the
// confirmation comes or within passes (the server then redelivers them, which changes nothing:
// every sink is idempotent). Without this a lost ack held the ack floor, and every composer
// waiting on it, for a whole AckWait. still, where set, is asked before every sending again
// whether the consumer that delivered msgs is still the one there is (consume.Runtime.Delivering):
// acks sent after it was made again would settle the new consumer's messages.
func (s *Settler) AckAll(ctx context.Context, msgs []jetstream.Msg, within time.Duration, still func() bool) {
	if len(msgs) == 0 {
		return
	}
	s.settled.WithLabelValues(Done.String()).Add(float64(len(msgs)))
	last := msgs[len(msgs)-1]
	for _, msg := range msgs[:len(msgs)-1] {
		_ = msg.Ack() // a failure here shows in the confirmation below
	}
	err := last.DoubleAck(ctx)
	if err == nil || errors.Is(err, jetstream.ErrMsgAlreadyAckd) {
		return // acked before (a commit tried again after a panic)
	}
	nc := s.js.Conn()
	deadline := time.Now().Add(within)
	for attempt := uint64(1); err != nil && ctx.Err() == nil && time.Now().Before(deadline); attempt++ {
		if attempt > 1 && errors.Is(err, nats.ErrNoResponders) {
			// Connected, and nothing answered the last confirmation, after a first that failed
			// too: the consumer (or its stream) is gone. Nothing will ever confirm these acks;
			// holding the batch (and, in the ranker, every commit) for the rest of within helps
			// no one. A consumer between two leaders answers nothing either for a moment: the
			// batch is then delivered again after AckWait, which every sink takes as a no-op.
			break
		}
		s.log.WarnContext(ctx, "ack not confirmed; sending the batch's acks again", "messages", len(msgs), "attempt", attempt, "error", err)
		_ = retry.Sleep(ctx, retry.Redelivery().Backoff(attempt)) // a stop still sends the acks once more
		if still != nil && !still() {
			s.log.WarnContext(ctx, "the consumer that delivered the batch is gone or was made again: its acks are not sent again", "messages", len(msgs))
			return
		}
		for _, msg := range msgs[:len(msgs)-1] {
			_ = nc.Publish(msg.Reply(), []byte("+ACK"))
		}
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err = nc.RequestWithContext(rctx, last.Reply(), []byte("+ACK"))
		cancel()
	}
	if err != nil {
		// Every sink is idempotent, so a redelivery of a handled message changes nothing.
		s.log.WarnContext(ctx, "acks not confirmed; the messages will be redelivered", "messages", len(msgs), "error", err)
	}
}

func (s *Settler) deadLetter(ctx context.Context, msg jetstream.Msg, reason string) {
	var err error
	for try := 1; try <= deadLetterTries; try++ {
		if err = events.DeadLetter(ctx, s.js, msg, reason); err == nil {
			s.log.WarnContext(ctx, "dead-lettered", "subject", msg.Subject(), "reason", reason)
			return
		}
		if try == deadLetterTries {
			break
		}
		if retry.Sleep(ctx, retry.Redelivery().Backoff(uint64(try))) != nil {
			break
		}
	}
	s.lost.Inc()
	s.log.ErrorContext(ctx, "dead letter failed; terminating the poison message anyway so it holds nothing up",
		"subject", msg.Subject(), "reason", reason, "error", err)
}

// KeepAlive tells the broker every interval that msgs are still being worked on, until the
// returned stop is called, so a long handling is not redelivered to another replica. Choose an
// interval well inside the consumer's AckWait (a third of it).
func KeepAlive(every time.Duration, msgs ...jetstream.Msg) (stop func()) {
	done := make(chan struct{})
	go func() {
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				for _, msg := range msgs {
					_ = msg.InProgress()
				}
			}
		}
	}()
	return func() { close(done) }
}
