package consume

import (
	"context"
	"fmt"
	"log/slog"
	"runtime/debug"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/podium-llm/podium/internal/settle"
)

// A handler that panics on a message would panic on every replica the message is redelivered
// to, and crash them one after the other. Recover turns the panic into a dead letter whose
// reason is the panic, logs the stack, and goes on with the next message.

// Recover is the middleware of a worker loop (one message per call).
func Recover(log *slog.Logger, panics prometheus.Counter) Middleware {
	return func(next HandlerFunc) HandlerFunc {
		return func(ctx context.Context, msg jetstream.Msg) (out context.Context, o settle.Outcome) {
			defer func() {
				if v := recover(); v != nil {
					out, o = ctx, settle.Reject(panicked(log, panics, msg, v))
				}
			}()
			return next(ctx, msg)
		}
	}
}

// RecoverBatches wraps a batch handler: a batch whose handling panics is handled again one
// message at a time, and a message that panics alone is dead-lettered with the panic as its
// reason, so one message costs only itself.
func RecoverBatches(log *slog.Logger, panics prometheus.Counter, settler *settle.Settler, h BatchFunc) BatchFunc {
	try := func(stop, work context.Context, msgs []jetstream.Msg) (v any) {
		defer func() { v = recover() }()
		h(stop, work, msgs)
		return nil
	}
	return func(stop, work context.Context, msgs []jetstream.Msg) {
		v := try(stop, work, msgs)
		if v == nil {
			return
		}
		if len(msgs) == 1 {
			settler.Settle(work, msgs[0], settle.Reject(panicked(log, panics, msgs[0], v)))
			return
		}
		log.Error("a batch panicked; handling its messages one at a time", "messages", len(msgs), "panic", fmt.Sprint(v))
		for _, msg := range msgs {
			if v := try(stop, work, []jetstream.Msg{msg}); v != nil {
				settler.Settle(work, msg, settle.Reject(panicked(log, panics, msg, v)))
			}
		}
	}
}

// panicked logs a handler's panic on msg with its stack, counts it, and returns the dead
// letter's reason.
func panicked(log *slog.Logger, panics prometheus.Counter, msg jetstream.Msg, v any) string {
	if panics != nil {
		panics.Inc()
	}
	seq := uint64(0)
	if md, err := msg.Metadata(); err == nil {
		seq = md.Sequence.Stream
	}
	reason := fmt.Sprintf("the handler panicked: %v", v)
	log.Error("handler panicked; the message is dead-lettered", "subject", msg.Subject(), "stream_seq", seq, "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
	return reason
}
