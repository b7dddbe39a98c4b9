package consume

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/podium-llm/podium/internal/panics"
	"github.com/podium-llm/podium/internal/settle"
)

// Recover is the one recovery of a handler's panic. A handler that panics on a message would
// panic on every replica the message is redelivered to, and crash them one after the other. A
// batch whose handling panics is handled again one message at a time, and a message that panics
// alone is dead-lettered with the panic as its reason (its stack logged, counted in counter), so
// one message costs only itself and the others go on.
func Recover(log *slog.Logger, counter prometheus.Counter) Middleware {
	return func(next Handler) Handler {
		try := func(ctx context.Context, msgs []jetstream.Msg) (res Result, p *panics.Panic) {
			p = panics.Catch(func() { res = next(ctx, msgs) })
			return res, p
		}
		return func(ctx context.Context, msgs []jetstream.Msg) Result {
			res, p := try(ctx, msgs)
			if p == nil {
				return res
			}
			if len(msgs) == 1 {
				return All(msgs, settle.Reject(panicked(log, counter, msgs[0], p)))
			}
			log.Error("a batch panicked; handling its messages one at a time", "messages", len(msgs), "panic", fmt.Sprint(p.Value))
			parts := make([]Result, len(msgs))
			for i, msg := range msgs {
				one := msgs[i : i+1]
				if parts[i], p = try(ctx, one); p != nil {
					parts[i] = All(one, settle.Reject(panicked(log, counter, msg, p)))
				}
			}
			return join(parts)
		}
	}
}

// panicked logs a handler's panic on msg with its stack, counts it, and returns the dead
// letter's reason.
func panicked(log *slog.Logger, counter prometheus.Counter, msg jetstream.Msg, p *panics.Panic) string {
	if counter != nil {
		counter.Inc()
	}
	seq := uint64(0)
	if md, err := msg.Metadata(); err == nil {
		seq = md.Sequence.Stream
	}
	log.Error("handler panicked; the message is dead-lettered", "subject", msg.Subject(), "stream_seq", seq, "panic", fmt.Sprint(p.Value), "stack", p.Stack)
	return fmt.Sprintf("the handler panicked: %v", p.Value)
}
