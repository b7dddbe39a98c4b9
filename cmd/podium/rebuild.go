package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/schollz/progressbar/v3"

	"github.com/podium-llm/podium/pkg/events"
	"github.com/podium-llm/podium/pkg/rank"
)

// storeRebuild writes the EVALUATIONS stream into the store again: the stream is the log, the
// store a view of it. Every message is parsed as the ranker parses it (the invalid ones, which
// the ranker dead-lettered, are skipped) and written with its stream sequence, so the rows are
// the ones the ranker wrote; writing a row again is harmless (reads collapse copies of an id),
// so a rebuild beside a running ranker, or run twice, changes nothing. Progress is noted every
// batch in the store (rank.RebuildFrom): an interrupted rebuild resumes there.
func storeRebuild(fs *flag.FlagSet) func(context.Context, *env) error {
	batchSize := fs.Int("batch", 1000, "evaluations per insert")
	fromStart := fs.Bool("from-start", false, "ignore the noted progress: write every evaluation the stream holds again")
	show := fs.Int("show", 20, "executions whose leaderboard the report prints (newest first)")
	noBar := fs.Bool("no-progress", false, "print a line every 10% instead of a progress bar")
	return func(ctx context.Context, e *env) error {
		if len(e.args) != 0 {
			return usagef("store rebuild takes no arguments")
		}
		if *batchSize < 1 {
			return usagef("--batch must be positive")
		}
		cfg := e.cfg.Store(nil)
		if err := rank.CreateDatabase(ctx, cfg); err != nil {
			return err
		}
		st, err := e.rank(ctx)
		if err != nil {
			return err
		}
		if _, err := st.Migrate(ctx); err != nil {
			return err
		}
		js, err := e.jetstream()
		if err != nil {
			return err
		}
		stream, err := js.Stream(ctx, events.StreamEvaluations)
		if err != nil {
			return fmt.Errorf("stream %s: %w", events.StreamEvaluations, err)
		}
		state := stream.CachedInfo().State
		from := uint64(0)
		if !*fromStart {
			if from, err = st.RebuildFrom(ctx); err != nil {
				return err
			}
		}
		start := max(from+1, state.FirstSeq)
		fmt.Fprintf(e.out, "rebuilding %s from %s: sequences %d-%d (%d messages)", e.cfg.ClickHouseDatabase, events.StreamEvaluations, state.FirstSeq, state.LastSeq, state.Msgs)
		if from > 0 {
			fmt.Fprintf(e.out, ", resuming after %d", from)
		}
		fmt.Fprintln(e.out)
		if state.FirstSeq > 1 {
			fmt.Fprintf(e.out, "note: the stream no longer holds sequences 1-%d (its retention removed them); what they held cannot be rebuilt\n", state.FirstSeq-1)
		}
		r := rebuilder{st: st, maxBytes: e.cfg.MaxEventBytes, batch: *batchSize, out: e.out, plain: *noBar}
		if start <= state.LastSeq {
			r.total = state.LastSeq - start + 1
			r.bar = newBar(e.out, int64(r.total), *noBar)
			if err := r.run(ctx, js, start, state.LastSeq); err != nil {
				return err
			}
		}
		fmt.Fprintf(e.out, "\n%d messages read, %d evaluations written, %d invalid skipped (the ranker dead-lettered them)\n", r.read, r.written, r.invalid)
		return report(ctx, e.out, st, *show)
	}
}

type rebuilder struct {
	st       *rank.Store
	maxBytes int
	batch    int
	out      io.Writer
	bar      *progressbar.ProgressBar
	plain    bool   // a line every tenth instead of the bar
	total    uint64 // sequences to read

	read, written, invalid int
	tenths                 uint64 // tenths of total reported so far (plain)
}

// progress reports done of total sequences.
func (r *rebuilder) progress(done uint64) {
	if !r.plain {
		_ = r.bar.Set64(int64(done))
		return
	}
	for r.total > 0 && (r.tenths+1)*r.total <= 10*done {
		r.tenths++
		fmt.Fprintf(r.out, "%d%%: %d of %d sequences read\n", r.tenths*10, done, r.total)
	}
}

// run writes sequences start to last, a batch at a time, noting progress after each.
func (r *rebuilder) run(ctx context.Context, js jetstream.JetStream, start, last uint64) error {
	cons, err := js.OrderedConsumer(ctx, events.StreamEvaluations, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{events.TypeEvaluationCompleted + ".>"},
		DeliverPolicy:  jetstream.DeliverByStartSequencePolicy, OptStartSeq: start})
	if err != nil {
		return fmt.Errorf("read %s: %w", events.StreamEvaluations, err)
	}
	var recs []rank.Record
	size, seq := 0, start-1
	flush := func() error {
		if len(recs) > 0 {
			if err := r.st.Insert(ctx, recs); err != nil {
				return err
			}
			r.written += len(recs)
		}
		if err := r.st.NoteRebuilt(ctx, seq); err != nil {
			return err
		}
		recs, size = recs[:0], 0
		return nil
	}
	for seq < last {
		batch, err := cons.FetchBytes(8<<20, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return fmt.Errorf("read %s: %w", events.StreamEvaluations, err)
		}
		n := 0
		for msg := range batch.Messages() {
			n++
			md, err := msg.Metadata()
			if err != nil {
				return err
			}
			seq = md.Sequence.Stream
			r.progress(seq - start + 1)
			r.read++
			ev, err := events.ParseEvaluation(msg.Subject(), msg.Data(), r.maxBytes)
			if err != nil {
				r.invalid++
			} else {
				recs = append(recs, rank.Record{EventID: ev.ID, Source: ev.Source, Seq: seq, EvaluationCompleted: ev.Data})
				size += len(msg.Data())
			}
			if len(recs) >= r.batch || size >= 8<<20 || seq >= last {
				if err := flush(); err != nil {
					return err
				}
			}
			if seq >= last {
				break
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) && !errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("read %s: %w", events.StreamEvaluations, err)
		}
		if n == 0 && seq < last {
			// Nothing more although the stream said it held up to last: the rest was deleted
			// meanwhile (retention, an operator).
			break
		}
	}
	_ = r.bar.Finish()
	return flush()
}

// newBar is the progress of a rebuild: a bar on a terminal, a line every 10% otherwise.
func newBar(w io.Writer, total int64, plain bool) *progressbar.ProgressBar {
	opts := []progressbar.Option{progressbar.OptionSetWriter(w), progressbar.OptionSetDescription("evaluations"),
		progressbar.OptionShowCount(), progressbar.OptionSetWidth(30), progressbar.OptionThrottle(200 * time.Millisecond),
		progressbar.OptionSetPredictTime(true), progressbar.OptionShowIts(), progressbar.OptionSetItsString("msg")}
	if plain {
		opts = append(opts, progressbar.OptionSetVisibility(false), progressbar.OptionOnCompletion(nil))
	}
	return progressbar.NewOptions64(total, opts...)
}

// report prints what the store holds now: rows, executions, and the newest executions' boards.
func report(ctx context.Context, w io.Writer, st *rank.Store, show int) error {
	execs, err := st.Executions(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "the store holds %d execution(s)\n", len(execs))
	ids := make([]string, 0, min(show, len(execs)))
	for _, x := range execs[:min(show, len(execs))] {
		ids = append(ids, x.ExecutionID)
	}
	boards, err := st.Leaderboards(ctx, ids, events.Desc, rank.Everything())
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(w, 1, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "EXECUTION\tTEAMS\tROUNDS\tLEADER\tBEST\tEVALUATIONS_SEQ")
	for _, x := range execs[:len(ids)] {
		b := boards[x.ExecutionID]
		leader, best := "", ""
		if len(b.Rows) > 0 {
			leader, best = b.Rows[0].TeamID, fmt.Sprint(b.Rows[0].BestScore)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%d\n", x.ExecutionID, x.Teams, x.MaxRound, leader, best, b.Seq)
	}
	if len(execs) > len(ids) {
		fmt.Fprintf(tw, "… %d more (podium leaderboard EXEC prints one)\n", len(execs)-len(ids))
	}
	return tw.Flush()
}
