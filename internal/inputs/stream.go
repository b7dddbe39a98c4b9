package inputs

import (
	"context"
	"fmt"
	"sync"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/pkg/events"
)

// evaluationsStream is a handle of the EVALUATIONS stream, looked up when there is none and
// dropped after a failed read, so the next read sees the stream's current configuration. The
// lookup runs without the lock: requests starting meanwhile look it up too, and the last one found
// is kept.
type evaluationsStream struct {
	js jetstream.JetStream

	mu sync.Mutex
	st jetstream.Stream
}

func (e *evaluationsStream) get(ctx context.Context) (jetstream.Stream, error) {
	e.mu.Lock()
	st := e.st
	e.mu.Unlock()
	if st != nil {
		return st, nil
	}
	st, err := e.js.Stream(ctx, events.StreamEvaluations)
	if err != nil {
		return nil, fmt.Errorf("EVALUATIONS stream: %w", err)
	}
	e.mu.Lock()
	e.st = st
	e.mu.Unlock()
	return st, nil
}

func (e *evaluationsStream) forget() {
	e.mu.Lock()
	e.st = nil
	e.mu.Unlock()
}
