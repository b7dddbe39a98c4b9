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

// A handler that panics on a message would panic on every replica the message is redelivered
// to, and crash them one after the other. Recover turns the panic into a dead letter whose
// reason is the panic, logs the stack, and goes on with the next message.

// Recover is the middleware of a worker loop (one message per call).
func Recover(log *slog.Logger, counter prometheus.Counter) Middleware {
	return func(next HandlerFunc) HandlerFunc {
		return func(ctx context.Context, msg jetstream.Msg) (out context.Context, o settle.Outcome) {
			if p := panics.Catch(func() { out, o = next(ctx, msg) }); p != nil {
				return ctx, settle.Reject(panicked(log, counter, msg, p))
			}
			return out, o
		}
	}
}

// RecoverBatches wraps a batch handler: a batch whose handling panics is handled again one
// message at a time, and a message that panics alone is dead-lettered with the panic as its
// reason, so one message costs only itself.
func RecoverBatches(log *slog.Logger, counter prometheus.Counter, settler *settle.Settler, h BatchFunc) BatchFunc {
	try := func(stop, work context.Context, msgs []jetstream.Msg) *panics.Panic {
		return panics.Catch(func() { h(stop, work, msgs) })
	}
	return func(stop, work context.Context, msgs []jetstream.Msg) {
		v := try(stop, work, msgs)
		if v == nil {
			return
		}
		if len(msgs) == 1 {
			settler.Settle(work, msgs[0], settle.Reject(panicked(log, counter, msgs[0], v)))
			return
		}
		log.Error("a batch panicked; handling its messages one at a time", "messages", len(msgs), "panic", fmt.Sprint(v.Value))
		for _, msg := range msgs {
			if v := try(stop, work, []jetstream.Msg{msg}); v != nil {
				settler.Settle(work, msg, settle.Reject(panicked(log, counter, msg, v)))
			}
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
	reason := fmt.Sprintf("the handler panicked: %v", p.Value)
	log.Error("handler panicked; the message is dead-lettered", "subject", msg.Subject(), "stream_seq", seq, "panic", fmt.Sprint(p.Value), "stack", p.Stack)
	return reason
}
