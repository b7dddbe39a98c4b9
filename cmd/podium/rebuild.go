package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/schollz/progressbar/v3"

	"github.com/podium-llm/podium/internal/chstore"
	"github.com/podium-llm/podium/internal/refill"
	"github.com/podium-llm/podium/pkg/events"
	"github.com/podium-llm/podium/pkg/rank"
)

// storeRebuild writes the EVALUATIONS stream into the store again (internal/refill, as the
// ranker does by itself when it finds its table lost): a rebuild beside a running ranker, or run
// twice, changes nothing. Progress is noted every batch in the store (rank.RebuildFrom): an
// interrupted rebuild resumes there. At the end the store gets a new lineage, which invalidates
// the score snapshots composers read.
func storeRebuild(fs *flag.FlagSet) func(context.Context, *env) error {
	batchSize := fs.Int("batch", 1000, "evaluations per insert")
	fromStart := fs.Bool("from-start", false, "ignore the noted progress: write every evaluation the stream holds again")
	show := fs.Int("show", 20, "executions whose leaderboard the report prints (newest first)")
	noBar := fs.Bool("no-progress", false, "print a line every 10% instead of a progress bar")
	return func(ctx context.Context, e *env) error {
		if *batchSize < 1 {
			return usagef("--batch must be positive")
		}
		cfg := e.cfg.Store(nil)
		if err := chstore.CreateDatabase(ctx, cfg); err != nil {
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
		// The rows are of the stream's era: the store's newest lineage's when it names this
		// stream, else the next one (the stream was made again since: rank.Pos).
		streamID := chstore.StreamID(stream.CachedInfo().Created)
		newest, _, err := st.Lineage(ctx)
		if err != nil {
			return err
		}
		era := newest.EraOf(streamID)
		r := rebuilder{out: e.out, plain: *noBar}
		var res refill.Result
		if start <= state.LastSeq {
			r.start, r.total = start, state.LastSeq-start+1
			r.bar = newBar(e.out, int64(r.total), *noBar)
			res, err = refill.Run(ctx, refill.Options{JS: js, MaxEventBytes: e.cfg.MaxEventBytes, Era: era, Batch: *batchSize, Read: r.progress,
				Written: func(ctx context.Context, seq uint64, _ chstore.RowKey) error { return st.NoteRebuilt(ctx, seq) }}, start-1, refill.Insert(st.Insert))
			_ = r.bar.Finish()
			if err != nil {
				return err
			}
		}
		fmt.Fprintf(e.out, "\n%d messages read, %d evaluations written, %d invalid skipped (the ranker dead-lettered them)\n", res.Read, res.Written, res.Invalid)
		// Everything derived from the store before (the ranker's score snapshots) names the
		// lineage it came from: a new one invalidates it, and the ranker publishes it to
		// composers at its next check of the store.
		anchor := res.Last
		if anchor == (chstore.RowKey{}) {
			if anchor, _, err = st.NewestRow(ctx); err != nil {
				return err
			}
		}
		epoch, err := st.NextEpoch(ctx, time.Now())
		if err != nil {
			return err
		}
		if err := st.NoteLineage(ctx, chstore.Lineage{Epoch: epoch, Stream: streamID, Era: era, Anchor: anchor, Whole: true}); err != nil {
			return err
		}
		return report(ctx, e.out, st, *show)
	}
}

// rebuilder reports a rebuild's progress.
type rebuilder struct {
	out          io.Writer
	bar          *progressbar.ProgressBar
	plain        bool   // a line every tenth instead of the bar
	start, total uint64 // the first sequence to read, and how many
	tenths       uint64 // tenths of total reported so far (plain)
}

// progress reports that sequence seq was read.
func (r *rebuilder) progress(seq uint64) {
	done := seq - r.start + 1
	if !r.plain {
		_ = r.bar.Set64(int64(done))
		return
	}
	for r.total > 0 && (r.tenths+1)*r.total <= 10*done {
		r.tenths++
		fmt.Fprintf(r.out, "%d%%: %d of %d sequences read\n", r.tenths*10, done, r.total)
	}
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
func report(ctx context.Context, w io.Writer, st *chstore.Store, show int) error {
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
