// Package refill writes the EVALUATIONS stream into the store again: the stream is the log, the
// evaluations table a view of it (internal/sink fills it). The ranker refills its table by itself
// when it finds it lost (internal/sink/refill.go, with RowOf); `podium store rebuild` does the same on an
// operator's word. Every message is parsed as the ranker parses it (the invalid ones, which the
// ranker dead-lettered, are skipped) and written with its stream sequence, so the rows are the
// ones the ranker wrote; writing a row again is harmless (reads collapse copies of an id).
package refill

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/internal/chstore"
	"github.com/podium-llm/podium/internal/sink"
	"github.com/podium-llm/podium/pkg/events"
	"github.com/podium-llm/podium/pkg/rank"
)

// Write stores a batch of records; it returns once they are stored, but for those the table
// refuses (by their place in recs), or with the error that stops the refill.
type Write func(ctx context.Context, recs []rank.Record) (refused map[int]error, err error)

// Insert is the Write of a store that refuses nothing it is given.
func Insert(insert func(context.Context, []rank.Record) error) Write {
	return func(ctx context.Context, recs []rank.Record) (map[int]error, error) { return nil, insert(ctx, recs) }
}

// Options say how a refill reads and writes.
type Options struct {
	JS            jetstream.JetStream
	MaxEventBytes int    // MAX_EVENT_BYTES: what the ranker accepts
	Era           uint32 // of the stream (rank.Pos): the rows are stored with it
	Batch         int    // records per write (default 1000)
	BatchBytes    int    // bytes of events per write (default 8 MiB)
	// Read, when set, hears of each message read, with its sequence.
	Read func(seq uint64)
	// Written, when set, hears after each write of the last sequence read so far (every
	// evaluation up to it is stored) and of the last row stored, if any was.
	Written func(ctx context.Context, seq uint64, last chstore.RowKey) error
}

// Result is what a refill did.
type Result struct {
	Read, Written, Invalid int
	// Last is the key of the last record stored; zero when none was.
	Last chstore.RowKey
	// Refused counts the records the table refused (the ranker dead-lettered them).
	Refused int
	// LastSeq is the last sequence read.
	LastSeq uint64
}

// RowOf is the row a message of EVALUATIONS becomes in era (its stream's), with the evaluation
// it was parsed to: the one way, for the ranker's live writes, its refills and `podium store
// rebuild` alike. An error is a message the ranker dead-letters (and a refill skips).
func RowOf(msg jetstream.Msg, era uint32, maxEventBytes int) (rank.Record, events.Evaluation, error) {
	md, err := msg.Metadata()
	if err != nil {
		return rank.Record{}, events.Evaluation{}, fmt.Errorf("message without JetStream metadata: %w", err)
	}
	ev, err := events.ParseEvaluation(msg.Subject(), msg.Data(), maxEventBytes)
	if err != nil {
		return rank.Record{}, events.Evaluation{}, err
	}
	return rank.RecordOf(ev, md.Sequence.Stream, era), ev, nil
}

// Run writes every evaluation of the stream after sequence after, up to what it held when the
// refill began.
func Run(ctx context.Context, o Options, after uint64, write Write) (Result, error) {
	src := sink.Source[rank.Record]{JS: o.JS, Stream: events.StreamEvaluations, Filter: events.TypeEvaluationCompleted + ".>",
		Batch: o.Batch, BatchBytes: o.BatchBytes, Read: o.Read,
		Row: func(msg jetstream.Msg) (rank.Record, bool) {
			rec, _, err := RowOf(msg, o.Era, o.MaxEventBytes)
			return rec, err == nil
		}}
	var progress func(context.Context, sink.Filled[rank.Record]) error
	if o.Written != nil {
		progress = func(ctx context.Context, f sink.Filled[rank.Record]) error {
			return o.Written(ctx, f.LastSeq, lastKey(f))
		}
	}
	f, err := sink.FillFrom(ctx, src, after, write, progress)
	return Result{Read: f.Read, Written: f.Written, Invalid: f.Skipped, Last: lastKey(f), Refused: f.Refused, LastSeq: f.LastSeq}, err
}

// lastKey is the key of the last record a fill stored; zero when none was.
func lastKey(f sink.Filled[rank.Record]) chstore.RowKey {
	if !f.HasLast {
		return chstore.RowKey{}
	}
	return chstore.KeyOf(f.Last)
}
