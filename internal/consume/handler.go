package consume

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/internal/panics"
	"github.com/podium-llm/podium/internal/settle"
)

// Handler handles a batch of messages (a worker's batch is one message) and says what becomes of
// each. It never acks, naks or terminates: the runtime settles the Result it returns, and keeps
// the messages in progress until then. Middleware (recover.go, trace.go) wraps handlers, which
// know nothing of it.
type Handler func(ctx context.Context, msgs []jetstream.Msg) Result

// Result is a handler's decision on a batch.
type Result struct {
	// Outcomes has one outcome per message, in the batch's order.
	Outcomes []settle.Outcome
	// Logs, where set, is the context each message is settled with (its span's, so the log lines
	// of its settling carry its trace); else the handler's.
	Logs []context.Context
	// After, where set, runs once every message is settled, the acks confirmed where the stage
	// confirms them: what may happen only once the ack floor shows the batch (the ranker's
	// notice to composers).
	After func(ctx context.Context)
}

// All is the Result of a batch whose messages all had outcome o.
func All(msgs []jetstream.Msg, o settle.Outcome) Result {
	out := make([]settle.Outcome, len(msgs))
	for i := range out {
		out[i] = o
	}
	return Result{Outcomes: out}
}

// Each makes a Handler of a function of one message: the messages of a batch are handled one
// after another, each settled with the context its handling returned.
func Each(h func(ctx context.Context, msg jetstream.Msg) (context.Context, settle.Outcome)) Handler {
	return func(ctx context.Context, msgs []jetstream.Msg) Result {
		res := Result{Outcomes: make([]settle.Outcome, len(msgs)), Logs: make([]context.Context, len(msgs))}
		for i, msg := range msgs {
			res.Logs[i], res.Outcomes[i] = h(ctx, msg)
		}
		return res
	}
}

// join is the Result of handling a batch's messages one by one: parts[i] is message i's, and
// gives it exactly one outcome (a part without one is given back for redelivery).
func join(parts []Result) Result {
	res := Result{Outcomes: make([]settle.Outcome, len(parts)), Logs: make([]context.Context, len(parts))}
	var afters []func(context.Context)
	for i, p := range parts {
		res.Outcomes[i] = settle.RetryLater(fmt.Errorf("the handler gave %d outcomes for one message", len(p.Outcomes)))
		if len(p.Outcomes) == 1 {
			res.Outcomes[i] = p.Outcomes[0]
		}
		if len(p.Logs) > 0 {
			res.Logs[i] = p.Logs[0]
		}
		if p.After != nil {
			afters = append(afters, p.After)
		}
	}
	if len(afters) > 0 {
		res.After = func(ctx context.Context) {
			for _, after := range afters {
				after(ctx)
			}
		}
	}
	return res
}

// Middleware wraps a handler with something every batch gets.
type Middleware func(Handler) Handler

// Chain applies middleware, the first outermost.
func Chain(h Handler, mw ...Middleware) Handler {
	for i := len(mw) - 1; i >= 0; i-- {
		h = mw[i](h)
	}
	return h
}

// Stage is what becomes of what a loop gathered: the handler handles it, the settler settles each
// outcome, then the Result's After runs. From the moment a loop takes messages until they are
// settled, the stage tells the broker every KeepAlive that they are still in hand (waiting to be
// handed over, for a lock, for inputs, behind a slow insert), so they are not delivered again to
// another replica meanwhile; the pull buffer does the same for what it holds before.
type Stage struct {
	Handler Handler
	Settler *settle.Settler
	// KeepAlive is how often messages in hand are kept in progress: a third of the AckWait.
	KeepAlive time.Duration
	// ConfirmAcks, when positive, acknowledges a batch's handled messages together and returns
	// only once the server confirmed them, trying for up to that long (settle.AckAll): where
	// others read the consumer's ack floor as what the service has done.
	ConfirmAcks time.Duration
	// Serial, when set, runs each handling and its settling inside it (the ranker holds its commit
	// lock over both, so no ack moves its ack floor while its store is checked or refilled).
	Serial func(func())
	// Log hears of a panic while settling or in After (nil: not logged).
	Log *slog.Logger
	// Current, when set, says whether a batch may still be settled: whether the consumer that
	// delivered it is the one there is now (Runtime.Delivering). A batch it refuses is handled
	// but not settled (nor its After skipped): its settlements would reach another consumer.
	Current func(ctx context.Context, msgs []jetstream.Msg) bool
	// InHand, when set, hears of each batch handed to the stage (n = 1) and of it settled
	// (n = -1), with the stream it was consumed from (StreamOf of its first message). A batch is
	// counted before the loop that filled it can return, so once a pass of the runtime has ended
	// (Runtime.Pass), every batch of it is counted until it is settled: the ranker tells its
	// other replicas from it whether a batch of a stream deleted since may still commit.
	InHand func(stream time.Time, n int)
}

// handed tells InHand of msgs, where it is set.
func (s Stage) handed(msgs []jetstream.Msg, n int) {
	if s.InHand != nil && len(msgs) > 0 {
		s.InHand(StreamOf(msgs[0]), n)
	}
}

// keepAlive keeps msgs in progress until the returned stop is called.
func (s Stage) keepAlive(msgs []jetstream.Msg) (stop func()) {
	if s.KeepAlive <= 0 {
		return func() {}
	}
	return settle.KeepAlive(s.KeepAlive, msgs...)
}

// run handles msgs under work and settles what the handler decided.
func (s Stage) run(work context.Context, msgs []jetstream.Msg) {
	defer s.keepAlive(msgs)()
	step := func() {
		res := s.Handler(work, msgs)
		// The handler's panics are Recover's; one while settling or after (the driver noting a
		// lineage, an ack) costs the batch's settling at worst: what is not settled is delivered
		// again after AckWait, and every sink is idempotent.
		if p := panics.Catch(func() {
			if s.Current != nil && !s.Current(work, msgs) {
				if s.Log != nil {
					s.Log.Warn("a batch is not settled: the consumer that delivered it is gone or was made again since (its acks would settle the new consumer's messages), or could not be looked up; it comes again after its ack wait if its consumer still holds it", "messages", len(msgs))
				}
			} else {
				s.settle(work, msgs, res)
			}
			if res.After != nil {
				res.After(work)
			}
		}); p != nil && s.Log != nil {
			s.Log.Error("settling a batch panicked", "messages", len(msgs), "panic", fmt.Sprint(p.Value), "stack", p.Stack)
		}
	}
	if s.Serial != nil {
		s.Serial(step)
		return
	}
	step()
}

// settle settles each message as res says; a message the handler gave no outcome (a handler's
// mistake) is given back for redelivery.
func (s Stage) settle(ctx context.Context, msgs []jetstream.Msg, res Result) {
	var done []jetstream.Msg
	for i, msg := range msgs {
		o := settle.RetryLater(fmt.Errorf("the handler gave no outcome for message %d of %d", i+1, len(msgs)))
		if i < len(res.Outcomes) {
			o = res.Outcomes[i]
		}
		lctx := ctx
		if i < len(res.Logs) && res.Logs[i] != nil {
			lctx = res.Logs[i]
		}
		if o.Kind == settle.Done && s.ConfirmAcks > 0 {
			done = append(done, msg)
			continue
		}
		s.Settler.Settle(lctx, msg, o)
	}
	var still func() bool
	if s.Current != nil {
		still = func() bool { return s.Current(ctx, msgs) }
	}
	s.Settler.AckAll(ctx, done, s.ConfirmAcks, still)
}
