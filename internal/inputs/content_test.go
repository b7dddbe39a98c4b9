package inputs

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/podium-llm/podium/pkg/rank"
)

// TestContentReadsBatchAndIsolate: while maxQueries content reads are held, requests of six teams
// of two executions queue and are read by one query; each gets its own team's content only,
// of the rounds it asked for or more.
func TestContentReadsBatchAndIsolate(t *testing.T) {
	h := newReadsHarness(t, harnessOptions{})
	var recs []rank.Record
	var seq uint64
	for _, exec := range []string{"x1", "x2"} {
		for k := range 4 {
			for r := 1; r <= 3; r++ {
				seq++
				rec := evalRecord(exec, seq, 16)
				rec.TeamID, rec.RoundNumber = fmt.Sprintf("t%d", k), r
				rec.EventID = fmt.Sprintf("%s-t%d-%d", exec, k, r)
				rec.Submission.Content = "content of " + rec.EventID
				recs = append(recs, rec)
			}
		}
	}
	if err := h.st.Insert(context.Background(), recs); err != nil {
		t.Fatal(err)
	}

	var mu sync.Mutex
	var queries [][]rank.TeamKey
	gate := make(chan struct{})
	read := func(ctx context.Context, keys []rank.TeamKey, from, before int) (map[rank.TeamKey]*rank.Content, error) {
		mu.Lock()
		queries = append(queries, keys)
		first := len(queries) <= maxQueries
		mu.Unlock()
		if first {
			<-gate // hold the first reads so the others queue behind them
		}
		return h.st.Contents(ctx, keys, from, before)
	}
	cr := newContentReads(read, newMetrics(prometheus.NewRegistry()))
	type result struct {
		key     rank.TeamKey
		content *rank.Content
		err     error
	}
	results := make(chan result, 16)
	ask := func(exec, team string, from, before int) {
		key := rank.TeamKey{ExecutionID: exec, TeamID: team}
		c, err := cr.get(context.Background(), key, from, before)
		results <- result{key, c, err}
	}
	held := func(n int) { // waits until n reads are held at the gate
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			mu.Lock()
			got := len(queries)
			mu.Unlock()
			if got == n {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d reads started, want %d held", got, n)
			}
		}
	}
	// One at a time, so each starts a read of its own: the second one then holds the last slot.
	go ask("x1", "t0", 1, 4)
	held(1)
	go ask("x2", "t0", 1, 4)
	held(maxQueries)
	queued := []rank.TeamKey{{ExecutionID: "x1", TeamID: "t1"}, {ExecutionID: "x1", TeamID: "t2"}, {ExecutionID: "x2", TeamID: "t3"}, {ExecutionID: "x2", TeamID: "t1"}}
	for i, k := range queued {
		go ask(k.ExecutionID, k.TeamID, 2+i%2, 4) // rounds 2-3 or 3 only
	}
	time.Sleep(100 * time.Millisecond) // let them queue
	close(gate)
	for range 2 + len(queued) {
		r := <-results
		if r.err != nil {
			t.Fatal(r.err)
		}
		scores, err := h.st.Scores(context.Background(), []string{r.key.ExecutionID})
		if err != nil {
			t.Fatal(err)
		}
		// Only this team's evaluations, and every round it asked for has its own content.
		if r.content.Len() > 3 {
			t.Errorf("%v: content of %d evaluations, more than the team's 3", r.key, r.content.Len())
		}
		for _, round := range scores[r.key.ExecutionID].Reduce(rank.Everything()).History(r.key.TeamID, r.content) {
			want := fmt.Sprintf("content of %s-%s-%d", r.key.ExecutionID, r.key.TeamID, round.RoundNumber)
			if round.RoundNumber >= 3 && round.Submission.Content != want {
				t.Errorf("%v round %d: submission %q, want %q", r.key, round.RoundNumber, round.Submission.Content, want)
			}
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(queries) != maxQueries+1 || len(queries[maxQueries]) != len(queued) {
		t.Errorf("queries %v, want %d held and one for the %d queued teams", queries, maxQueries, len(queued))
	}
}
