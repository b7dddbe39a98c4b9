package consume

import (
	"context"
	"sync"

	"github.com/nats-io/nats.go/jetstream"
)

// Workers is a Loop of n goroutines, each handing one message at a time to the stage.
func Workers(n int, stage Stage, warn func(msg string, args ...any)) Loop {
	return LoopFunc(func(stop, work context.Context, it Messages) error {
		var mu sync.Mutex
		var last error
		var wg sync.WaitGroup
		for range n {
			wg.Go(func() {
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
					stage.run(work, []jetstream.Msg{msg})
				}
			})
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
	})
}
