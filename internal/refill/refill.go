// Package refill writes the EVALUATIONS stream into the store again: the stream is the log, the
// evaluations table a view of it. The ranker refills its table by itself when it finds it lost
// (internal/ranker/lineage.go); `podium store rebuild` does the same on an operator's word. Every
// message is parsed as the ranker parses it (the invalid ones, which the ranker dead-lettered,
// are skipped) and written with its stream sequence, so the rows are the ones the ranker wrote;
// writing a row again is harmless (reads collapse copies of an id).
package refill

import (
	"context"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/podium-llm/podium/internal/chstore"
	"github.com/podium-llm/podium/internal/streamscan"
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
	MaxEventBytes int // MAX_EVENT_BYTES: what the ranker accepts
	Batch         int // records per write (default 1000)
	BatchBytes    int // bytes of events per write (default 8 MiB)
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

// Run writes every evaluation of the stream after sequence after, up to what it held when the
// refill began.
func Run(ctx context.Context, o Options, after uint64, write Write) (Result, error) {
	batchSize, batchBytes := o.Batch, o.BatchBytes
	if batchSize <= 0 {
		batchSize = 1000
	}
	if batchBytes <= 0 {
		batchBytes = 8 << 20
	}
	var res Result
	var recs []rank.Record
	size := 0
	flush := func() error {
		if len(recs) > 0 {
			refused, err := write(ctx, recs)
			if err != nil {
				return err
			}
			res.Written += len(recs) - len(refused)
			res.Refused += len(refused)
			for i := len(recs) - 1; i >= 0; i-- {
				if refused[i] == nil {
					res.Last = chstore.KeyOf(recs[i]) // the anchor must be a row the table holds
					break
				}
			}
		}
		recs, size = recs[:0], 0
		if o.Written != nil {
			return o.Written(ctx, res.LastSeq, res.Last)
		}
		return nil
	}
	_, err := streamscan.Scan(ctx, o.JS, events.StreamEvaluations, events.TypeEvaluationCompleted+".>", after, func(msg jetstream.Msg) error {
		md, err := msg.Metadata()
		if err != nil {
			return err
		}
		res.LastSeq = md.Sequence.Stream
		res.Read++
		if o.Read != nil {
			o.Read(res.LastSeq)
		}
		ev, err := events.ParseEvaluation(msg.Subject(), msg.Data(), o.MaxEventBytes)
		if err != nil {
			res.Invalid++
			return nil
		}
		recs = append(recs, rank.Record{EventID: ev.ID, Source: ev.Source, Seq: res.LastSeq, EvaluationCompleted: ev.Data})
		if size += len(msg.Data()); len(recs) >= batchSize || size >= batchBytes {
			return flush()
		}
		return nil
	})
	if err != nil {
		return res, err
	}
	return res, flush()
}
