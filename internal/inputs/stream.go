package inputs

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/internal/streamscan"
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

// next is the sequence of the first message on subject at or after seq; 0 when there is none.
//
// It asks the stream's leader whenever the stream has replicas: a direct get may be answered by
// any replica of an R3 stream, a lagging one among them, which would say "nothing since" of a
// message it has not received yet, and a stale snapshot would pass for complete. On one replica
// the leader answers either way, and the direct get costs the server less.
func (e *evaluationsStream) next(ctx context.Context, subject string, seq uint64) (uint64, error) {
	st, err := e.get(ctx)
	if err != nil {
		return 0, err
	}
	if st.CachedInfo().Config.Replicas <= 1 {
		msg, err := st.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subject))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return 0, nil
		}
		if err != nil {
			return 0, err
		}
		return msg.Sequence, nil
	}
	return leaderNext(ctx, e.js.Conn(), events.StreamEvaluations, subject, seq)
}

// leaderNext is the sequence of the first message on subject at or after seq, as the stream's
// leader answers (streamscan.LeaderNext); 0 when there is none.
func leaderNext(ctx context.Context, nc *nats.Conn, stream, subject string, seq uint64) (uint64, error) {
	m, err := streamscan.LeaderNext(ctx, nc, stream, subject, seq)
	if err != nil || m == nil {
		return 0, err
	}
	md, err := m.Metadata()
	if err != nil {
		return 0, err
	}
	return md.Sequence.Stream, nil
}
