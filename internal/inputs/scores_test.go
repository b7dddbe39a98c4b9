package inputs

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/podium-llm/podium/internal/chstore"
	"github.com/podium-llm/podium/internal/testenv"
	"github.com/podium-llm/podium/pkg/events"
	"github.com/podium-llm/podium/pkg/rank"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// waitLimit bounds every wait of these tests for something that must happen.
const waitLimit = 15 * time.Second

// readCall is one call of the store read: its ids, and the gate the test opens to let it run.
type readCall struct {
	ids     []string
	release func()
}

// storeReader wraps the real Store.Evaluations: it records the ids of every call and, when gated,
// holds each call until the test releases it, so the test decides when a read is in flight.
type storeReader struct {
	st      *chstore.Store
	gated   bool
	started chan *readCall

	mu    sync.Mutex
	calls []*readCall
}

func (r *storeReader) read(ctx context.Context, ids []string) (map[string]*rank.Evaluations, error) {
	gate := make(chan struct{})
	var once sync.Once
	c := &readCall{ids: slices.Clone(ids), release: func() { once.Do(func() { close(gate) }) }}
	r.mu.Lock()
	r.calls = append(r.calls, c)
	r.mu.Unlock()
	if r.gated {
		r.started <- c
		<-gate
	}
	return r.st.Scores(ctx, ids)
}

func (r *storeReader) callIDs() [][]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([][]string, len(r.calls))
	for i, c := range r.calls {
		out[i] = c.ids
	}
	return out
}

type readsHarness struct {
	st *chstore.Store
	r  *storeReader
	m  *Metrics
	s  *storeReads
}

type harnessOptions struct {
	ttl     time.Duration
	maxKept int // 0: maxKeptBytes
	gated   bool
	noTable bool // open the store without migrating it: every read fails
}

func newReadsHarness(t *testing.T, o harnessOptions) *readsHarness {
	t.Helper()
	st, _ := testenv.Store(t, !o.noTable)
	r := &storeReader{st: st, gated: o.gated, started: make(chan *readCall, 64)}
	// A failed test may leave reads gated: release them so no goroutine outlives it blocked.
	t.Cleanup(func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, c := range r.calls {
			c.release()
		}
	})
	m := newMetrics(prometheus.NewRegistry())
	if o.maxKept == 0 {
		o.maxKept = maxKeptBytes
	}
	return &readsHarness{st: st, r: r, m: m, s: newStoreReads(r.read, o.ttl, o.maxKept, m, time.Now)}
}

// evalRecord is one evaluation of team "team-<exec>" in execution exec, with a submission of
// the given size.
func evalRecord(exec string, seq uint64, submissionBytes int) rank.Record {
	return rank.Record{EventID: "ev-" + exec, Source: "test", Seq: seq, EvaluationCompleted: events.EvaluationCompleted{
		ExecutionID: exec, TeamID: "team-" + exec, TeamName: "Team " + exec, RoundNumber: 1,
		Submission:  events.Submission{Content: strings.Repeat("x", submissionBytes), Format: "md"},
		Evaluation:  events.Scores{OverallScore: 50, Metrics: []events.Metric{{MetricName: "m", Score: 50, EvaluatorComment: "c"}}},
		EvaluatedAt: time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC),
	}}
}

// insert stores one evaluation for each execution.
func (h *readsHarness) insert(t *testing.T, execs ...string) {
	t.Helper()
	recs := make([]rank.Record, len(execs))
	for i, e := range execs {
		recs[i] = evalRecord(e, uint64(i+1), 16)
	}
	if err := h.st.Insert(context.Background(), recs); err != nil {
		t.Fatal(err)
	}
}

// next returns the next read call that started, failing if none starts.
func (h *readsHarness) next(t *testing.T) *readCall {
	t.Helper()
	select {
	case c := <-h.r.started:
		return c
	case <-time.After(waitLimit):
		t.Fatal("no store read started")
		return nil
	}
}

// noRead checks that no read starts for a short while.
func (h *readsHarness) noRead(t *testing.T) {
	t.Helper()
	select {
	case c := <-h.r.started:
		t.Fatalf("unexpected store read of %v", c.ids)
	case <-time.After(50 * time.Millisecond):
	}
}

// until polls a condition on the state of the storeReads' batcher.
func (h *readsHarness) until(t *testing.T, what string, cond func(b *batcher[string, rank.Pos, *rank.Evaluations]) bool) {
	t.Helper()
	testenv.WaitFor(t, waitLimit, what, func() (bool, string) { return cond(h.s.b), "not yet" })
}

// joined waits until n requests are on the read in flight for exec.
func (h *readsHarness) joined(t *testing.T, exec string, n int) {
	t.Helper()
	h.until(t, fmt.Sprintf("%d requests are on the read of %s", n, exec), func(b *batcher[string, rank.Pos, *rank.Evaluations]) bool {
		_, requests := b.runningFor(exec)
		return requests == n
	})
}

// queued waits until n requests of exec wait for the next read.
func (h *readsHarness) queued(t *testing.T, exec string, n int) {
	t.Helper()
	h.until(t, fmt.Sprintf("%d requests of %s wait for the next read", n, exec), func(b *batcher[string, rank.Pos, *rank.Evaluations]) bool {
		requests, _ := b.queuedFor(exec)
		return requests == n
	})
}

type getResult struct {
	ev   *rank.Evaluations
	err  error
	done chan struct{}
}

// goGet runs get in the background.
func (h *readsHarness) goGet(ctx context.Context, exec string, seq uint64) *getResult {
	g := &getResult{done: make(chan struct{})}
	go func() {
		defer close(g.done)
		g.ev, g.err = h.s.get(ctx, exec, rank.Pos{Seq: seq})
	}()
	return g
}

func (g *getResult) wait(t *testing.T) (*rank.Evaluations, error) {
	t.Helper()
	select {
	case <-g.done:
		return g.ev, g.err
	case <-time.After(waitLimit):
		t.Fatal("get did not return")
		return nil, nil
	}
}

func (g *getResult) finished() bool {
	select {
	case <-g.done:
		return true
	default:
		return false
	}
}

// mustEv waits for a get that must succeed and checks it read exec from the store.
func (g *getResult) mustEv(t *testing.T, exec string) *rank.Evaluations {
	t.Helper()
	ev, err := g.wait(t)
	if err != nil {
		t.Fatalf("get %s: %v", exec, err)
	}
	if got, want := teamsOf(ev), []string{"team-" + exec}; !slices.Equal(got, want) {
		t.Fatalf("get %s read teams %v, want %v", exec, got, want)
	}
	return ev
}

// getNow is a get expected to be served without a new read (a kept one, or ungated).
func (h *readsHarness) getNow(t *testing.T, exec string, seq uint64) *rank.Evaluations {
	t.Helper()
	return h.goGet(context.Background(), exec, seq).mustEv(t, exec)
}

// getReleased is a get in gated mode that must start a read of exactly [exec]; it lets it run.
func (h *readsHarness) getReleased(t *testing.T, exec string, seq uint64) (*rank.Evaluations, error) {
	t.Helper()
	g := h.goGet(context.Background(), exec, seq)
	c := h.next(t)
	if diff := cmp.Diff([]string{exec}, c.ids); diff != "" {
		t.Errorf("read ids (-want +got):\n%s", diff)
	}
	c.release()
	return g.wait(t)
}

func teamsOf(ev *rank.Evaluations) []string {
	if ev == nil {
		return nil
	}
	var teams []string
	for _, row := range ev.Reduce(rank.Everything()).Leaderboard(events.Desc).Rows {
		teams = append(teams, row.TeamID)
	}
	return teams
}

// readCounts reads composer_store_reads_total by result. It reads the counters directly, as
// prometheus/testutil.ToFloat64 does: testutil needs a module go.mod does not list.
func readCounts(t *testing.T, m *Metrics) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for _, result := range []string{"queried", "shared", "cached"} {
		var pb dto.Metric
		if err := m.storeReads.WithLabelValues(result).Write(&pb); err != nil {
			t.Fatal(err)
		}
		out[result] = pb.GetCounter().GetValue()
	}
	return out
}

func counts(queried, shared, cached float64) map[string]float64 {
	return map[string]float64{"queried": queried, "shared": shared, "cached": cached}
}

func samePointer(t *testing.T, what string, want, got *rank.Evaluations) {
	t.Helper()
	if got != want {
		t.Errorf("%s: got evaluations %p, want the shared %p", what, got, want)
	}
}

func TestStoreReads(t *testing.T) {
	bg := context.Background()
	tests := []struct {
		name string
		opts harnessOptions
		run  func(t *testing.T, h *readsHarness)
		// wantCalls are the ids of every store read, in order; nil when run checks them itself.
		wantCalls  [][]string
		wantCounts map[string]float64
	}{
		{
			name: "a get of the execution and seq of a read in flight joins it",
			opts: harnessOptions{gated: true},
			run: func(t *testing.T, h *readsHarness) {
				h.insert(t, "e")
				first := h.goGet(bg, "e", 5)
				c := h.next(t)
				second := h.goGet(bg, "e", 5)
				h.joined(t, "e", 2)
				if first.finished() || second.finished() {
					t.Fatal("a get returned before its read was released")
				}
				c.release()
				ev := first.mustEv(t, "e")
				samePointer(t, "second get", ev, second.mustEv(t, "e"))
			},
			wantCalls:  [][]string{{"e"}},
			wantCounts: counts(1, 1, 0),
		},
		{
			name: "a get with a lower or equal seq joins the read in flight",
			opts: harnessOptions{gated: true},
			run: func(t *testing.T, h *readsHarness) {
				h.insert(t, "e")
				first := h.goGet(bg, "e", 5)
				c := h.next(t)
				equal := h.goGet(bg, "e", 5)
				lower := h.goGet(bg, "e", 3)
				h.joined(t, "e", 3)
				h.noRead(t)
				c.release()
				ev := first.mustEv(t, "e")
				samePointer(t, "equal seq", ev, equal.mustEv(t, "e"))
				samePointer(t, "lower seq", ev, lower.mustEv(t, "e"))
			},
			wantCalls:  [][]string{{"e"}},
			wantCounts: counts(1, 2, 0),
		},
		{
			name: "a get with a higher seq does not join: it starts a read of its own",
			opts: harnessOptions{gated: true},
			run: func(t *testing.T, h *readsHarness) {
				h.insert(t, "e")
				first := h.goGet(bg, "e", 5)
				c1 := h.next(t)
				higher := h.goGet(bg, "e", 6)
				// A query slot is free, so the second read starts while the first still runs.
				c2 := h.next(t)
				// Later gets join the read started last, whose seq is 6.
				equal := h.goGet(bg, "e", 6)
				lower := h.goGet(bg, "e", 5)
				h.until(t, "three requests are on the seq 6 read", func(b *batcher[string, rank.Pos, *rank.Evaluations]) bool {
					started, requests := b.runningFor("e")
					return len(started) > 0 && latest(started) == rank.Pos{Seq: 6} && requests == 3
				})
				c2.release()
				ev2 := higher.mustEv(t, "e")
				samePointer(t, "equal seq on the second read", ev2, equal.mustEv(t, "e"))
				samePointer(t, "lower seq on the second read", ev2, lower.mustEv(t, "e"))
				if first.finished() {
					t.Fatal("the seq 5 get returned before its own read was released")
				}
				c1.release()
				ev1 := first.mustEv(t, "e")
				if ev1 == ev2 {
					t.Error("the seq 5 and seq 6 gets got the same evaluations, want two reads")
				}
			},
			wantCalls:  [][]string{{"e"}, {"e"}},
			wantCounts: counts(2, 2, 0),
		},
		{
			name: "with maxQueries reads in flight, gets of other executions queue for one read",
			opts: harnessOptions{gated: true},
			run: func(t *testing.T, h *readsHarness) {
				if maxQueries != 2 {
					t.Fatalf("the case is written for maxQueries 2, it is %d", maxQueries)
				}
				h.insert(t, "a", "b", "c", "d", "e")
				a := h.goGet(bg, "a", 1)
				ca := h.next(t)
				b := h.goGet(bg, "b", 1)
				cb := h.next(t)
				// Both query slots are busy now.
				bJoin := h.goGet(bg, "b", 1)
				h.joined(t, "b", 2)
				aHigher := h.goGet(bg, "a", 2) // higher seq than a's read: queues
				e := h.goGet(bg, "e", 1)
				d1 := h.goGet(bg, "d", 1)
				d2 := h.goGet(bg, "d", 1)
				c := h.goGet(bg, "c", 1)
				h.queued(t, "a", 1)
				h.queued(t, "c", 1)
				h.queued(t, "d", 2)
				h.queued(t, "e", 1)
				h.noRead(t)

				ca.release()
				batch := h.next(t)
				if diff := cmp.Diff([]string{"a", "c", "d", "e"}, batch.ids); diff != "" {
					t.Errorf("batched read ids (-want +got):\n%s", diff)
				}
				cb.release()
				batch.release()

				evA := a.mustEv(t, "a")
				evB := b.mustEv(t, "b")
				samePointer(t, "b joined", evB, bJoin.mustEv(t, "b"))
				if aHigher.mustEv(t, "a") == evA {
					t.Error("the seq 2 get of a got a's seq 1 read, want the batched read")
				}
				e.mustEv(t, "e")
				c.mustEv(t, "c")
				samePointer(t, "d's second get", d1.mustEv(t, "d"), d2.mustEv(t, "d"))
			},
			wantCalls: [][]string{{"a"}, {"b"}, {"a", "c", "d", "e"}},
			// queried: a, b, then a, c, d, e of the batch; shared: b's join and d's second get.
			wantCounts: counts(6, 2, 0),
		},
		{
			name: "a read holds at most maxBatch executions",
			opts: harnessOptions{gated: true},
			run: func(t *testing.T, h *readsHarness) {
				var queued []string
				for i := range maxBatch + 2 {
					queued = append(queued, fmt.Sprintf("q%02d", i))
				}
				h.insert(t, append([]string{"busy1", "busy2"}, queued...)...)
				busy1 := h.goGet(bg, "busy1", 1)
				c1 := h.next(t)
				busy2 := h.goGet(bg, "busy2", 1)
				c2 := h.next(t)
				gets := map[string]*getResult{}
				for _, e := range queued {
					gets[e] = h.goGet(bg, e, 1)
				}
				h.until(t, "every queued execution waits", func(b *batcher[string, rank.Pos, *rank.Evaluations]) bool {
					_, keys := b.queuedFor("")
					return keys == len(queued)
				})

				c1.release()
				full := h.next(t)
				c2.release() // busy2's query slot reads the rest
				rest := h.next(t)
				full.release()
				rest.release()

				if len(full.ids) != maxBatch {
					t.Errorf("first batch has %d executions, want maxBatch %d", len(full.ids), maxBatch)
				}
				for _, ids := range [][]string{full.ids, rest.ids} {
					if !slices.IsSorted(ids) {
						t.Errorf("batch ids %v are not sorted", ids)
					}
				}
				all := slices.Sorted(slices.Values(append(slices.Clone(full.ids), rest.ids...)))
				if diff := cmp.Diff(queued, all); diff != "" {
					t.Errorf("the two batches do not hold every queued execution exactly once (-want +got):\n%s", diff)
				}
				busy1.mustEv(t, "busy1")
				busy2.mustEv(t, "busy2")
				for e, g := range gets {
					g.mustEv(t, e)
				}
				if got := len(h.r.callIDs()); got != 4 {
					t.Errorf("store reads = %d, want 4", got)
				}
			},
			wantCounts: counts(maxBatch+4, 0, 0),
		},
		{
			name: "a finished read serves gets of its execution with seq up to its own within ttl",
			opts: harnessOptions{ttl: time.Minute},
			run: func(t *testing.T, h *readsHarness) {
				h.insert(t, "e", "f")
				ev5 := h.getNow(t, "e", 5)
				samePointer(t, "equal seq from the kept read", ev5, h.getNow(t, "e", 5))
				samePointer(t, "lower seq from the kept read", ev5, h.getNow(t, "e", 2))
				ev6 := h.getNow(t, "e", 6) // higher than kept: queries
				if ev6 == ev5 {
					t.Error("the seq 6 get got the kept seq 5 read")
				}
				samePointer(t, "seq 6 from the new kept read", ev6, h.getNow(t, "e", 6))
				samePointer(t, "seq 5 from the new kept read", ev6, h.getNow(t, "e", 5))
				h.getNow(t, "f", 1) // another execution is not served by e's read
			},
			wantCalls:  [][]string{{"e"}, {"e"}, {"f"}},
			wantCounts: counts(3, 0, 4),
		},
		{
			name: "after ttl a get queries again",
			opts: harnessOptions{ttl: 500 * time.Millisecond},
			run: func(t *testing.T, h *readsHarness) {
				h.insert(t, "e")
				ev := h.getNow(t, "e", 5)
				samePointer(t, "within ttl", ev, h.getNow(t, "e", 5))
				time.Sleep(600 * time.Millisecond)
				if h.getNow(t, "e", 5) == ev {
					t.Error("after ttl the get got the expired read")
				}
			},
			wantCalls:  [][]string{{"e"}, {"e"}},
			wantCounts: counts(2, 0, 1),
		},
		{
			name: "with ttl 0 nothing is kept",
			opts: harnessOptions{ttl: 0},
			run: func(t *testing.T, h *readsHarness) {
				h.insert(t, "e")
				ev := h.getNow(t, "e", 5)
				if h.getNow(t, "e", 5) == ev {
					t.Error("the second get got the first read")
				}
				h.s.mu.Lock()
				defer h.s.mu.Unlock()
				if len(h.s.kept) != 0 || h.s.bytes != 0 {
					t.Errorf("kept %d reads of %d bytes, want none", len(h.s.kept), h.s.bytes)
				}
			},
			wantCalls:  [][]string{{"e"}, {"e"}},
			wantCounts: counts(2, 0, 0),
		},
		{
			name: "a read finishing last with a lower seq does not replace the kept one",
			opts: harnessOptions{ttl: time.Minute, gated: true},
			run: func(t *testing.T, h *readsHarness) {
				h.insert(t, "e")
				low := h.goGet(bg, "e", 5)
				c5 := h.next(t)
				high := h.goGet(bg, "e", 6)
				c6 := h.next(t)
				c6.release()
				ev6 := high.mustEv(t, "e")
				c5.release()
				ev5 := low.mustEv(t, "e")
				if ev5 == ev6 {
					t.Fatal("the two reads returned the same evaluations")
				}
				samePointer(t, "seq 6 after both reads", ev6, h.getNow(t, "e", 6))
			},
			wantCalls:  [][]string{{"e"}, {"e"}},
			wantCounts: counts(2, 0, 1),
		},
		{
			name: "a get that gives up does not fail the others on its read",
			opts: harnessOptions{gated: true},
			run: func(t *testing.T, h *readsHarness) {
				h.insert(t, "e")
				ctx, cancel := context.WithCancel(bg)
				quitter := h.goGet(ctx, "e", 5)
				c := h.next(t)
				stayer := h.goGet(bg, "e", 5)
				h.joined(t, "e", 2)
				cancel()
				if _, err := quitter.wait(t); !errors.Is(err, context.Canceled) {
					t.Errorf("cancelled get: err = %v, want context.Canceled", err)
				}
				c.release()
				stayer.mustEv(t, "e")
			},
			wantCalls:  [][]string{{"e"}},
			wantCounts: counts(1, 1, 0),
		},
		{
			name: "a failed read fails every request on it and keeps nothing",
			opts: harnessOptions{ttl: time.Minute, gated: true, noTable: true},
			run: func(t *testing.T, h *readsHarness) {
				a1 := h.goGet(bg, "a", 1)
				ca := h.next(t)
				a2 := h.goGet(bg, "a", 1)
				h.joined(t, "a", 2)
				b := h.goGet(bg, "b", 1)
				cb := h.next(t)
				c := h.goGet(bg, "c", 1)
				d := h.goGet(bg, "d", 1)
				h.queued(t, "c", 1)
				h.queued(t, "d", 1)
				ca.release()
				batch := h.next(t)
				cb.release()
				batch.release()

				var errA error
				for name, g := range map[string]*getResult{"a1": a1, "a2": a2, "b": b, "c": c, "d": d} {
					ev, err := g.wait(t)
					if err == nil || ev != nil {
						t.Errorf("get %s = (%p, %v), want an error from the store", name, ev, err)
					}
					if name == "a1" {
						errA = err
					}
				}
				if _, err := a2.wait(t); err != errA {
					t.Errorf("joined get of a: err %v, want the read's error %v", err, errA)
				}
				h.s.mu.Lock()
				kept := len(h.s.kept)
				h.s.mu.Unlock()
				if kept != 0 {
					t.Errorf("%d reads kept after failures, want none", kept)
				}

				// The store recovers: the next gets query again and succeed.
				if _, err := h.st.Migrate(bg); err != nil {
					t.Fatal(err)
				}
				h.insert(t, "a", "c")
				for _, e := range []string{"a", "c"} {
					ev, err := h.getReleased(t, e, 1)
					if err != nil {
						t.Fatalf("get %s after recovery: %v", e, err)
					}
					if got, want := teamsOf(ev), []string{"team-" + e}; !slices.Equal(got, want) {
						t.Errorf("get %s after recovery read %v, want %v", e, got, want)
					}
				}
			},
			wantCalls:  [][]string{{"a"}, {"b"}, {"c", "d"}, {"a"}, {"c"}},
			wantCounts: counts(6, 1, 0),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newReadsHarness(t, tt.opts)
			tt.run(t, h)
			if tt.wantCalls != nil {
				if diff := cmp.Diff(tt.wantCalls, h.r.callIDs()); diff != "" {
					t.Errorf("store reads (-want +got):\n%s", diff)
				}
			}
			if diff := cmp.Diff(tt.wantCounts, readCounts(t, h.m)); diff != "" {
				t.Errorf("composer_store_reads_total (-want +got):\n%s", diff)
			}
		})
	}
}

// TestStoreReadsKeepWithinMaxKeptBytes fills the kept reads past their byte cap: one execution
// fits with the reduction its requests make of it, a second beside it does not.
func TestStoreReadsKeepWithinMaxKeptBytes(t *testing.T) {
	const ttl = 3 * time.Second
	const rows = 8
	var recs []rank.Record
	for i := range rows {
		rec := evalRecord("x", uint64(i+1), 16)
		rec.EventID, rec.RoundNumber = fmt.Sprint(i), i+1
		recs = append(recs, rec)
	}
	sized, _ := rank.FromRecords(recs)
	fresh := sized.Bytes()
	sized.Reduce(rank.Everything())
	reduced := sized.Bytes()
	maxKept := reduced + fresh/2 // a reduced read fits; a fresh one beside it does not
	h := newReadsHarness(t, harnessOptions{ttl: ttl, maxKept: maxKept})
	var seq uint64
	for _, e := range []string{"big1", "big2"} {
		for i := range rows {
			seq++
			rec := evalRecord(e, seq, 16)
			rec.EventID = fmt.Sprintf("ev-%s-%d", e, i)
			rec.RoundNumber = i + 1
			if err := h.st.Insert(context.Background(), []rank.Record{rec}); err != nil {
				t.Fatal(err)
			}
		}
	}

	steps := []struct {
		name    string
		exec    string
		sleep   time.Duration // before the get
		want    string        // queried or cached
		keptNow []string      // executions kept after the get
	}{
		{name: "first big read is kept", exec: "big1", want: "queried", keptNow: []string{"big1"}},
		{name: "second does not fit: not kept", exec: "big2", want: "queried", keptNow: []string{"big1"}},
		{name: "so it is read again", exec: "big2", want: "queried", keptNow: []string{"big1"}},
		{name: "the first is still kept", exec: "big1", want: "cached", keptNow: []string{"big1"}},
		{name: "once the first expired the second fits", exec: "big2", sleep: ttl + 200*time.Millisecond, want: "queried", keptNow: []string{"big2"}},
		{name: "and is kept", exec: "big2", want: "cached", keptNow: []string{"big2"}},
	}
	for _, step := range steps {
		t.Run(step.name, func(t *testing.T) {
			time.Sleep(step.sleep)
			before := readCounts(t, h.m)
			ev := h.getNow(t, step.exec, 1)
			if ev.Bytes() != reduced {
				t.Fatalf("read of %s holds %d bytes once reduced, want %d", step.exec, ev.Bytes(), reduced)
			}
			after := readCounts(t, h.m)
			for _, result := range []string{"queried", "cached"} {
				want := before[result]
				if result == step.want {
					want++
				}
				if after[result] != want {
					t.Errorf("composer_store_reads_total{result=%q} = %v, want %v", result, after[result], want)
				}
			}
			h.s.mu.Lock()
			kept := slices.Sorted(maps.Keys(h.s.kept))
			bytes := h.s.bytes
			h.s.mu.Unlock()
			if diff := cmp.Diff(step.keptNow, kept); diff != "" {
				t.Errorf("kept executions (-want +got):\n%s", diff)
			}
			if bytes > maxKept {
				t.Errorf("kept %d bytes, over the cap %d", bytes, maxKept)
			}
		})
	}
}

// TestStoreReadsUseCompleteSnapshots: an execution whose snapshot in SCORES is complete through
// the sequence a request waits for is served from it, without a ClickHouse read; so is one whose
// snapshot stops short of it while the EVALUATIONS stream holds nothing of that execution since;
// one with an evaluation since, one of another store lineage than the ranker publishes (read
// before a refill or a rebuild, or of a stream since made again), or without a snapshot, is read
// from ClickHouse.
func TestStoreReadsUseCompleteSnapshots(t *testing.T) {
	h := newReadsHarness(t, harnessOptions{})
	h.insert(t, "fresh", "quiet", "stale", "none", "relineaged")
	_, js := testenv.JetStream(t, testenv.NATS(t))
	ctx := t.Context()
	kv, err := js.CreateOrUpdateKeyValue(ctx, events.ScoresBucketConfig(1, 0))
	if err != nil {
		t.Fatal(err)
	}
	if err := events.EnsureStreams(ctx, js, events.StreamOptions{}, events.StreamEvaluations); err != nil {
		t.Fatal(err)
	}
	// Sequences 1-6: quiet and stale before 3, then other executions, and stale again at 4.
	for _, exec := range []string{"quiet", "stale", "other", "stale", "other", "other"} {
		if _, err := js.Publish(ctx, events.EvaluationSubject(exec, "t"), []byte("{}")); err != nil {
			t.Fatal(err)
		}
	}
	evs, err := h.st.Scores(ctx, []string{"fresh", "quiet", "stale", "relineaged"})
	if err != nil {
		t.Fatal(err)
	}
	stream, err := js.Stream(ctx, events.StreamEvaluations)
	if err != nil {
		t.Fatal(err)
	}
	current := "42@" + chstore.StreamID(stream.CachedInfo().Created)
	for exec, d := range map[string]rank.Derivation{"fresh": {Through: 10, Lineage: current}, "quiet": {Through: 2, Lineage: current},
		"stale": {Through: 2, Lineage: current}, "relineaged": {Through: 10, Lineage: "41@" + chstore.StreamID(stream.CachedInfo().Created)}} {
		b, _ := evs[exec].Snapshot(d)
		if _, err := kv.Put(ctx, exec, b); err != nil {
			t.Fatal(err)
		}
	}
	lin := &lineage{}
	lin.saw(current, "", 0, chstore.RowKey{}, stream.CachedInfo().Created, time.Now())
	h.s.snaps = newSnapshots(js, &evaluationsStream{js: js}, realClock{}, lin)
	for _, tt := range []struct{ exec, want string }{{"fresh", "snapshot"}, {"quiet", "snapshot"}, {"stale", "queried"}, {"none", "queried"}, {"relineaged", "queried"}} {
		before := readCounts(t, h.m)
		var pb dto.Metric
		_ = h.m.storeReads.WithLabelValues("snapshot").Write(&pb)
		snapBefore := pb.GetCounter().GetValue()
		ev := h.getNow(t, tt.exec, 5)
		if got := teamsOf(ev); !slices.Equal(got, []string{"team-" + tt.exec}) {
			t.Errorf("%s: teams %v", tt.exec, got)
		}
		_ = h.m.storeReads.WithLabelValues("snapshot").Write(&pb)
		fromSnapshot := pb.GetCounter().GetValue() - snapBefore
		queried := readCounts(t, h.m)["queried"] - before["queried"]
		if tt.want == "snapshot" && (fromSnapshot != 1 || queried != 0) || tt.want == "queried" && (fromSnapshot != 0 || queried != 1) {
			t.Errorf("%s: %v from the snapshot, %v queried; want %s", tt.exec, fromSnapshot, queried, tt.want)
		}
	}
	if calls := slices.Sorted(slices.Values(flatten(h.r.callIDs()))); !slices.Equal(calls, []string{"none", "relineaged", "stale"}) {
		t.Errorf("ClickHouse reads %v, want none, relineaged and stale only", calls)
	}
}

func flatten(calls [][]string) []string {
	var out []string
	for _, c := range calls {
		out = append(out, c...)
	}
	return out
}
