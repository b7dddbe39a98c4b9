package ranker

import (
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/podium-llm/podium/internal/sink"
	"github.com/podium-llm/podium/pkg/events"
	"github.com/podium-llm/podium/pkg/rank"
)

// withPasses gives the fixture's ranker a RANKER_PASSES bucket on its server, and returns another
// replica over the same store, stream and bucket whose runtime's pass and batches in hand the test
// sets (passOf, and its keeper's InHand).
func (f *lineageFixture) withPasses(t *testing.T) (other *ranker, pass *time.Time) {
	t.Helper()
	kv, err := events.EnsureBucket(t.Context(), f.js, events.RankerPassesBucketConfig(1), false)
	if err != nil {
		t.Fatal(err)
	}
	a := f.r
	a.passes = newPasses(kv, f.js, a.log, a.passNow, a.keep.RefillStale, a.m)
	b := &ranker{log: slog.New(slog.NewJSONHandler(io.Discard, nil)), js: f.js, store: a.store, m: newMetrics(prometheus.NewRegistry()), now: time.Now}
	pass = new(time.Time)
	b.passOf = func() time.Time { return *pass }
	b.keep = b.newKeeper()
	b.passes = newPasses(kv, f.js, b.log, b.passNow, a.keep.RefillStale, b.m)
	return b, pass
}

// note notes r's pass as it is now.
func note(t *testing.T, r *ranker) (fenced bool) {
	t.Helper()
	fenced, err := r.passes.note(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return fenced
}

// TestTheEraWaitsForAnotherRankersBatch forces the two-replica interleaving: EVALUATIONS deleted and
// made again while another ranker replica still holds a batch of the stream before, and the ranker
// that checks its store consumes the new stream with nothing in hand. Before, it began the new era
// at once (it knew only its own runtime): a request composed as of the new era lacked the other
// replica's batch, which then committed in the era before. Now the era waits for the other's note
// to say that its pass reads the new stream and that it has settled what it held.
func TestTheEraWaitsForAnotherRankersBatch(t *testing.T) {
	ctx := t.Context()
	f := newLineageFixture(t) // this ranker consumes the new stream (its Consumes is nil)
	a := f.r
	b, pass := f.withPasses(t)
	*pass = f.stream.CachedInfo().Created // the other's pass reads the stream before...
	b.keep.InHand(*pass, 1)               // ...with a batch of it in hand
	note(t, a)
	note(t, b)
	now := f.remake(t)

	if err := a.keep.CheckLocked(ctx); !errors.Is(err, sink.ErrBeforeInHand) {
		t.Fatalf("the check while another replica holds a batch of the stream before: %v, want errBeforeInHand", err)
	}
	if got := a.keep.Published(); got.Era != 0 {
		t.Fatalf("the new era was published while another replica holds a batch of the stream before: %+v", got)
	}
	// Its pass ended (its consumer went with the stream), the batch still in hand.
	*pass = time.Time{}
	note(t, b)
	if err := a.keep.CheckLocked(ctx); !errors.Is(err, sink.ErrBeforeInHand) {
		t.Fatalf("the check while the other replica is between passes with a batch in hand: %v, want errBeforeInHand", err)
	}
	// Its pass reads the new stream now, but the batch of the pass before is not settled yet.
	*pass = now.CachedInfo().Created
	note(t, b)
	if err := a.keep.CheckLocked(ctx); !errors.Is(err, sink.ErrBeforeInHand) {
		t.Fatalf("the check while the other's batch of the stream before is still in hand: %v, want errBeforeInHand", err)
	}
	b.keep.InHand(now.CachedInfo().Created, 1)       // a batch of the new stream: never holds the switch to it
	b.keep.InHand(f.stream.CachedInfo().Created, -1) // committed, in the era before
	note(t, b)
	if err := a.keep.CheckLocked(ctx); err != nil {
		t.Fatal(err)
	}
	if got := a.keep.Published(); got.Era != 1 {
		t.Fatalf("once the other replica settled its batch: era %d, want 1", got.Era)
	}
}

// TestARankerWhoseNotesStandStillIsFenced: a replica that holds a batch of the stream before and
// notes nothing any more (dead, or paused) is waited for until its note has stood still for the
// stale time as the checking ranker watches it, then fenced, and the era begins; one that goes on
// noting is waited for however long that takes. The fenced one, noting again, learns that it was
// fenced and counts it.
func TestARankerWhoseNotesStandStillIsFenced(t *testing.T) {
	ctx := t.Context()
	f := newLineageFixture(t, func(c *sink.Config[rank.Record]) { c.StaleAfter = 200 * time.Millisecond })
	a := f.r
	still, pass := f.withPasses(t)
	live, livePass := f.withPasses(t)
	*pass, *livePass = f.stream.CachedInfo().Created, f.stream.CachedInfo().Created
	still.keep.InHand(*pass, 1)
	live.keep.InHand(*livePass, 1)
	note(t, still)
	note(t, live)
	now := f.remake(t)

	// The live one notes before every check: its note moves, so it is never taken for gone; the
	// still one is, once the checks have seen its note unchanged for the stale time.
	fenced := false
	for try := 0; try < 100 && !fenced; try++ {
		note(t, live)
		if err := a.keep.CheckLocked(ctx); !errors.Is(err, sink.ErrBeforeInHand) {
			t.Fatalf("check %d while the live replica holds a batch of the stream before: %v, want errBeforeInHand", try, err)
		}
		fenced = testutil.ToFloat64(a.m.replicasFenced) == 1
		time.Sleep(50 * time.Millisecond)
	}
	if !fenced {
		t.Fatal("the replica whose note stood still was never fenced")
	}
	if got := a.keep.Published(); got.Era != 0 {
		t.Fatalf("the era began while the live replica holds a batch of the stream before: %+v", got)
	}
	*livePass = now.CachedInfo().Created
	live.keep.InHand(f.stream.CachedInfo().Created, -1)
	note(t, live)
	if err := a.keep.CheckLocked(ctx); err != nil {
		t.Fatal(err)
	}
	if got := a.keep.Published(); got.Era != 1 {
		t.Fatalf("once the live replica settled its batch: era %d, want 1", got.Era)
	}
	if n := testutil.ToFloat64(a.m.replicasFenced); n != 1 {
		t.Errorf("%v replicas fenced, want 1 (the live one must never be)", n)
	}

	// The still one wakes: it learns that it was fenced, once, and notes on as before.
	if !note(t, still) {
		t.Error("the fenced replica did not learn that it was fenced")
	}
	if note(t, still) {
		t.Error("the fenced replica was told so again at its next note")
	}
	if n := testutil.ToFloat64(still.m.replicaFenced); n != 1 {
		t.Errorf("ranker_replica_fenced_total is %v on the fenced replica, want 1", n)
	}
	if n := testutil.ToFloat64(live.m.replicaFenced); n != 0 {
		t.Errorf("ranker_replica_fenced_total is %v on the live replica, want 0", n)
	}
}
