package sink

import (
	"context"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/internal/streamscan"
)

// Source is the stream a table is a view of, and how one of its messages becomes a row.
type Source[R any] struct {
	JS             jetstream.JetStream
	Stream, Filter string
	// Row reads one message as the row the service's consumer stored for it; false for a message
	// that is not one (the consumer dead-lettered it: a fill skips it). Every row written again
	// is the one the consumer wrote, so writing it twice is harmless.
	Row func(msg jetstream.Msg) (R, bool)
	// Batch and BatchBytes bound one write, in rows and in the bytes of their messages (defaults
	// 1000 rows, 8 MiB).
	Batch, BatchBytes int
	// Read, when set, hears of each message read, with its sequence (a progress bar).
	Read func(seq uint64)
}

// Filled is what a fill did so far.
type Filled[R any] struct {
	Read, Written, Skipped, Refused int
	// Last is the last row stored (HasLast: one was): a row the table holds, the anchor a
	// lineage may name.
	Last    R
	HasLast bool
	// LastSeq is the stream sequence of the last message read: every row up to it is stored.
	LastSeq uint64
}

// FillFrom writes every row of the stream after sequence after (0: from the first), up to what it
// held when the fill began, in batches through write, which returns the rows the table refused
// by their place in the batch (written and refused are then counted apart) or the error that stops
// the fill. progress, when set, hears after each write of what the fill did so far; its error
// stops the fill too.
func FillFrom[R any](ctx context.Context, src Source[R], after uint64, write func(context.Context, []R) (map[int]error, error),
	progress func(context.Context, Filled[R]) error) (Filled[R], error) {
	batch, batchBytes := src.Batch, src.BatchBytes
	if batch <= 0 {
		batch = 1000
	}
	if batchBytes <= 0 {
		batchBytes = 8 << 20
	}
	var done Filled[R]
	rows := make([]R, 0, min(batch, 1024))
	size := 0
	flush := func() error {
		if len(rows) > 0 {
			refused, err := write(ctx, rows)
			if err != nil {
				return err
			}
			done.Written += len(rows) - len(refused)
			done.Refused += len(refused)
			for i := len(rows) - 1; i >= 0; i-- {
				if refused[i] == nil {
					done.Last, done.HasLast = rows[i], true // a row the table holds
					break
				}
			}
		}
		rows, size = rows[:0], 0
		if progress != nil {
			return progress(ctx, done)
		}
		return nil
	}
	_, err := streamscan.Scan(ctx, src.JS, src.Stream, src.Filter, after, func(msg jetstream.Msg) error {
		md, err := msg.Metadata()
		if err != nil {
			return err
		}
		done.LastSeq = md.Sequence.Stream
		done.Read++
		if src.Read != nil {
			src.Read(done.LastSeq)
		}
		row, ok := src.Row(msg)
		if !ok {
			done.Skipped++
			return nil
		}
		rows, size = append(rows, row), size+len(msg.Data())
		if len(rows) >= batch || size >= batchBytes {
			return flush()
		}
		return nil
	})
	if err != nil {
		return done, err
	}
	return done, flush()
}
