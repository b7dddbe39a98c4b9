package main

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/podium-llm/podium/pkg/events"
	"github.com/podium-llm/podium/pkg/rank"
)

// announcer collects the executions committed batches touched until the announcer goroutine
// takes them, so a burst of batches costs one leaderboard read per execution, not one per batch.
type announcer struct {
	mu      sync.Mutex
	pending map[string]bool
	wake    chan struct{}
	done    chan struct{} // closed by close, to cut the pause between rounds short
	closed  bool
}

func newAnnouncer() *announcer {
	return &announcer{pending: map[string]bool{}, wake: make(chan struct{}, 1), done: make(chan struct{})}
}

func (a *announcer) add(recs []rank.Record) {
	ids := make([]string, len(recs))
	for i, rec := range recs {
		ids[i] = rec.ExecutionID
	}
	a.addIDs(ids)
}

func (a *announcer) addIDs(ids []string) {
	if len(ids) == 0 {
		return
	}
	a.mu.Lock()
	for _, id := range ids {
		a.pending[id] = true
	}
	a.mu.Unlock()
	select {
	case a.wake <- struct{}{}:
	default:
	}
}

func (a *announcer) close() {
	a.mu.Lock()
	a.closed = true
	a.mu.Unlock()
	close(a.done)
	select {
	case a.wake <- struct{}{}:
	default:
	}
}

// take returns the executions to announce, sorted, and whether more may come.
func (a *announcer) take() ([]string, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	ids := make([]string, 0, len(a.pending))
	for id := range a.pending {
		ids = append(ids, id)
	}
	clear(a.pending)
	slices.Sort(ids)
	return ids, !a.closed
}

// announce publishes one leaderboard.updated per execution with newly committed evaluations,
// read after the commit, until the announcer is closed and emptied. Rounds are at least
// announceInterval apart: executions committed meanwhile wait and share the next round, so a
// burst of batches costs ClickHouse one leaderboard read per execution per interval rather than
// one per batch, and the inserts keep the server's CPU. An execution whose announcement failed
// goes back to the next round (at least a second later): it is retried until published, or
// superseded by a later board, which the next read returns anyway.
func (r *ranker) announce(ctx context.Context, a *announcer) {
	for {
		<-a.wake
		ids, open := a.take()
		var failed []string
		if len(ids) > 0 {
			failed = r.publishBoards(ctx, ids)
		}
		if !open {
			if ids, _ := a.take(); len(ids) > 0 {
				failed = append(failed, r.publishBoards(ctx, ids)...)
			}
			if len(failed) > 0 {
				r.log.Error("leaderboard.updated not published before stopping", "executions", failed)
			}
			return
		}
		pause := r.announceInterval
		if len(failed) > 0 {
			a.addIDs(failed)
			pause = max(pause, time.Second)
		}
		if len(ids) > 0 {
			select {
			case <-a.done:
			case <-time.After(pause):
			}
		}
	}
}

// publishBoards announces the executions' current leaderboards and returns those it could not.
func (r *ranker) publishBoards(ctx context.Context, ids []string) (failed []string) {
	start := time.Now()
	boards, err := r.store.Leaderboards(ctx, ids, events.Desc, rank.Everything())
	r.m.leaderboardQuery.Observe(time.Since(start).Seconds())
	if err != nil {
		r.m.clickhouseErrors.WithLabelValues("query").Inc()
		r.log.Warn("leaderboard read for leaderboard.updated failed; will retry", "executions", len(ids), "error", err)
		return ids
	}
	for _, id := range ids {
		b := boards[id]
		data := events.LeaderboardUpdated{ExecutionID: id, Leaderboard: b.Rows, EvaluationsSeq: b.Seq}
		evID := events.DerivedID("leaderboard", id, fmt.Sprint(b.Seq))
		body, err := events.Marshal(evID, r.source, events.TypeLeaderboardUpdated, r.now(), data)
		if err == nil {
			_, err = events.Publish(ctx, r.js, events.LeaderboardSubject(id), evID, body)
		}
		if err != nil {
			r.log.Warn("leaderboard.updated not published; will retry", "execution_id", id, "error", err)
			failed = append(failed, id)
			continue
		}
		r.m.leaderboardsSent.Inc()
	}
	return failed
}
