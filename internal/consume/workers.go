package consume

import (
	"context"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/internal/settle"
)

// HandlerFunc handles one message and says what becomes of it; it never acks, naks or
// terminates. The context it returns is the one its settling logs with (a span's, so log lines
// carry the message's trace).
type HandlerFunc func(ctx context.Context, msg jetstream.Msg) (context.Context, settle.Outcome)

// Middleware wraps a handler with something every message gets.
type Middleware func(HandlerFunc) HandlerFunc

// KeepAlive tells the broker every interval that the message is still in hand while the
// handler runs, so a long wait is not redelivered to another replica.
func KeepAlive(every time.Duration) Middleware {
	return func(next HandlerFunc) HandlerFunc {
		return func(ctx context.Context, msg jetstream.Msg) (context.Context, settle.Outcome) {
			stop := settle.KeepAlive(every, msg)
			defer stop()
			return next(ctx, msg)
		}
	}
}

// Chain applies middleware, the first outermost.
func Chain(h HandlerFunc, mw ...Middleware) HandlerFunc {
	for i := len(mw) - 1; i >= 0; i-- {
		h = mw[i](h)
	}
	return h
}

// Workers is a Loop of n goroutines, each handling one message at a time under work and
// settling it with settler.
func Workers(n int, h HandlerFunc, settler *settle.Settler, warn func(msg string, args ...any)) Loop {
	return func(stop, work context.Context, it Messages) error {
		var mu sync.Mutex
		var last error
		var wg sync.WaitGroup
		for range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					msg, err := it.Next(context.Background()) // Stop and Drain end it
					if err != nil {
						if closed(err) {
							return
						}
						mu.Lock()
						last = err
						mu.Unlock()
						if lostConsumer(err) {
							it.Stop() // nothing more will come: every worker ends, Run makes it again
							return
						}
						warn("fetch failed", "error", err)
						continue
					}
					ctx, outcome := h(work, msg)
					settler.Settle(ctx, msg, outcome)
				}
			}()
		}
		ended := make(chan struct{})
		go func() { wg.Wait(); close(ended) }()
		select {
		case <-stop.Done():
			// Drain: no new pulls; what this client already holds is still handled.
			it.Drain()
			<-ended
		case <-ended:
		}
		mu.Lock()
		defer mu.Unlock()
		return last
	}
}
